"""Which tree a DFlash round verifies: its candidates from the drafter, its size from --tree N or,
with --tree auto, from the cost curve.

Candidates per depth: a v1 drafter's head top-k (`ranked_candidates`); a DFlash2 drafter's selector
candidates, ranked by the selector's scores. Those scores condition each position on the greedy
chain's previous pick (the selector walks left to right), so they are exact along the chain only;
a node off the chain is scored as if its parent were the chain's token at that depth.

--tree auto prices a round as the chain's auto verify length does (committed tokens per ms of
draft and verify from the cost curve at the round's depth), each node valued at exp(its summed
log-prob from the root), scaled by what this run accepted of such nodes: one rate for the chain's
nodes, one for the nodes off it (second choices). Best-first insertion makes every prefix of the
tree's nodes the best tree of that size, so each size is one cumulative sum; the chain's lengths
are priced the same way, and the round verifies the chain where no tree beats it.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np

from engine.decode.cost_curve_data import CostCurve
from engine.decode.drafts import Proposal
from engine.decode.tree.layout import DraftTree, best_first, build_tree, ranked_candidates, top_candidates
from engine.decode.tree.walk import sampled_candidates

WIDTH = 4  # a v1 head's candidates per depth (DFlash2: the selector's own K)
DECAY = 0.97  # weight of a round's evidence after each newer round (as the chain's auto: ~30 rounds)
PRIOR = 2.0  # expected nodes of prior evidence, at a rate of 1 (the drafter's probabilities as they are)
MIN_ROUNDS = 3  # --tree auto tries each kind of round (chain, tree) this often before it compares them
TRY_EVERY = 8  # ...and then the kind that loses once every this many rounds


def candidates(proposal: Proposal, key: Optional[mx.array] = None, width: int = WIDTH
               ) -> tuple[np.ndarray, np.ndarray]:
    """(ids, log-probs) (D, K) per depth, best first, from a drafter's proposal. At T > 0 (`key`) the
    log-probs are still the ranked ones, which shape the tree, but the ids are K draws without
    replacement from the distribution the drafts were sampled from (walk.sampled_candidates): what
    the rejection sampling over siblings needs to stay exact."""
    s = proposal.selection
    if key is not None:  # one evaluation for both: the ranked scores and the draws
        width = s.candidates.shape[-1] if s is not None else width
        ranked, drawn = top_candidates(proposal.logq, width), sampled_candidates(proposal.logq, width, key)
        mx.eval(ranked, drawn)
        return best_first(*drawn)[0], best_first(*ranked)[1]
    if s is None:
        return ranked_candidates(proposal.logits, width)
    logq = s.scores.astype(mx.float32)
    logq = logq - mx.logsumexp(logq, axis=-1, keepdims=True)
    order = mx.argsort(-logq, axis=-1)
    ids, logq = mx.take_along_axis(s.candidates, order, axis=-1), mx.take_along_axis(logq, order, axis=-1)
    mx.eval(ids, logq)
    return np.array(ids, dtype=np.int64), np.array(logq, dtype=np.float64)


def first_nodes(tree: DraftTree, n: int) -> DraftTree:
    """The tree of its first n draft nodes (parents come before children: still a tree)."""
    k = n + 1
    return DraftTree(tree.tokens[:k], tree.parents[:k], tree.depths[:k], tree.logq[:k], tree.scores[:k],
                     tree.ranks[:k])


def on_chain(tree: DraftTree) -> np.ndarray:
    """Per node: whether it is on the greedy chain (rank 0 all the way from the root)."""
    chain = np.zeros(len(tree), dtype=bool)
    chain[0] = True
    for node in range(1, len(tree)):
        chain[node] = tree.ranks[node] == 0 and chain[tree.parents[node]]
    return chain


class TreePlanner:
    """A round's tree (or None: the chain) from the drafter's proposal; `budget` draft nodes, or auto."""

    def __init__(self, budget: int, auto: bool):
        self.budget, self.auto = budget, auto
        self.curve: Optional[CostCurve] = None
        # decayed evidence per kind of node [chain, off the chain]: accepted nodes, and expected ones
        self.accepted = [0.0, 0.0]
        self.expected = [0.0, 0.0]
        self.last: Optional[DraftTree] = None  # --tree auto: the last round's tree before it was sized
        # --tree auto, per kind of round [chain, tree]: decayed rounds, tokens committed, rows verified
        self.rounds, self.tokens, self.rows = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
        self.since = 0  # rounds since the kind that lost was last tried

    def wants_tree(self, position: int) -> bool:
        """--tree auto, before the round drafts: whether to draft the whole block for a tree. A tree
        round drafts the whole block and verifies its tree's rows, a chain round drafts and verifies
        only auto's length: each kind's tokens a round (this run's) over its price on the curve at
        this depth (draft and verify of its mean rows). The kind that loses is tried again now and
        then (every TRY_EVERY rounds), and each is tried MIN_ROUNDS times first."""
        tree = self._tree_pays(position)
        if not tree:
            self.last = None  # a chain round's evidence is not that tree's
        return tree

    def _tree_pays(self, position: int) -> bool:
        if not self.auto or self.curve is None:
            return True
        if min(self.rounds) < MIN_ROUNDS:
            return self.rounds[1] <= self.rounds[0]
        curve = self.curve.at(position)
        per_ms = []
        for kind in (0, 1):
            rows = max(1, min(len(curve.verify_ms), round(self.rows[kind] / self.rounds[kind])))
            draft = (curve.draft_ms or 0.0) if kind else (curve.draft_by_length_ms or [0.0] * rows)[rows - 1]
            per_ms.append(self.tokens[kind] / self.rounds[kind] / (draft + curve.verify_ms[rows - 1]))
        best = int(per_ms[1] > per_ms[0])
        self.since += 1
        if self.since >= TRY_EVERY:
            self.since = 0
            return not best
        return bool(best)

    def counted(self, tree: bool, committed: int, rows: int) -> None:
        """A drafting round of either kind: the tokens it committed and the rows it verified."""
        kind = int(tree)
        for i in (0, 1):
            self.rounds[i] *= DECAY
            self.tokens[i] *= DECAY
            self.rows[i] *= DECAY
        self.rounds[kind] += 1.0
        self.tokens[kind] += committed
        self.rows[kind] += rows

    def price(self, curve: CostCurve) -> None:
        self.curve = curve

    def rates(self) -> tuple[float, float]:
        """What this run accepted of the nodes it verified, per expected one: on the chain, off it."""
        return tuple((a + PRIOR) / (e + PRIOR) for a, e in zip(self.accepted, self.expected))

    def plan(self, anchor: int, proposal: Proposal, position: int, key: Optional[mx.array] = None
             ) -> tuple[Optional[DraftTree], int]:
        """(the round's tree, or None for the chain; the chain's drafts to verify then). `proposal`
        holds the drafter's block, evaluated here; `key` (T > 0) draws the tree's tokens. The tree's
        shape and whether it is verified at all depend on the drafter's scores, never on the draws."""
        ids, logq = candidates(proposal, key)
        depth = ids.shape[0]
        if not self.auto or self.curve is None:
            return build_tree(anchor, ids, logq, self.budget or depth), depth
        curve = self.curve.at(position)
        most = min(len(curve.verify_ms) - 1, self.budget or depth * ids.shape[1])
        tree = self.last = build_tree(anchor, ids, logq, most)
        chain = on_chain(tree)
        main, side = self.rates()
        value = np.exp(tree.scores.astype(np.float64)) * np.where(chain, main, side)
        value[0] = 1.0  # the round's own token (bonus or correction)
        cost = np.array(curve.verify_ms[: len(tree)]) + (curve.draft_ms or 0.0)
        tree_per_ms = np.cumsum(value) / cost
        chain_value = np.cumsum(value[chain])
        chain_per_ms = chain_value / cost[: chain_value.shape[0]]
        n = int(np.argmax(tree_per_ms))
        if tree_per_ms[n] <= chain_per_ms.max() or chain[: n + 1].all():
            return None, int(np.argmax(chain_per_ms))
        return first_nodes(tree, n), depth

    def record(self, tree: Optional[DraftTree], path: list[int], chain_drafts: int = 0) -> None:
        """A round's outcome: the tree it verified and the nodes accepted; a chain's round (tree None)
        verified the first `chain_drafts` drafts of the last tree planned's chain, and accepted
        len(path) - 1 of them."""
        if tree is None:
            if self.last is not None:
                keep = np.flatnonzero(on_chain(self.last))[1 : chain_drafts + 1]
                self._add(0, float(np.exp(self.last.scores[keep].astype(np.float64)).sum()), len(path) - 1)
            return
        chain = on_chain(tree)
        expected = np.exp(tree.scores.astype(np.float64))[1:]
        hit = np.zeros(len(tree), dtype=bool)
        hit[path[1:]] = True
        for i, kind in enumerate((chain[1:], ~chain[1:])):
            self._add(i, float(expected[kind].sum()), float(hit[1:][kind].sum()))

    def _add(self, kind: int, expected: float, accepted: float) -> None:
        """One round's evidence for a kind of node (0: on the chain, 1: off it)."""
        self.expected[kind] = self.expected[kind] * DECAY + expected
        self.accepted[kind] = self.accepted[kind] * DECAY + accepted
