"""Which tree a DFlash round verifies: its candidates from the drafter, its size from --tree N or,
with --tree auto, from the cost curve.

Candidates per depth: a v1 drafter's head top-k (`ranked_candidates`); a DFlash2 drafter's selector
candidates, ranked by the selector's scores after each node's own parent (`selector_rows`: the
selector scores a candidate after its predecessor, and the T = 0 walk has every such score), so
a node off the greedy chain is scored as the selector would score it there. At T > 0 the tree is
ranked by the walk's scores along its sampled chain.

--tree auto keeps the chain's draft: the round drafts the positions auto verify length chose for a
chain, so a tree costs no extra draft and is never deeper than the chain. Its tree is the whole
chain, then second choices best first (each prefix of them the best of its size), so at T = 0 it
accepts at least what the chain would on the same drafts. Each number of second choices is priced
(committed tokens per ms of draft and verify, from the cost curve at the round's depth) against the
chain alone, each node valued at exp(its summed log-prob from the root) scaled by what this run
accepted of such nodes per expected one (on the chain, off it); none is the chain.

The curve does not see a tree round's host work (the drafts awaited before the verify is built,
the mask, positions per row, the compaction): each kind of round's measured time over its price on
the curve is kept (decayed), a planned round's (tree or chain: planning waits for the drafts) apart
from an unplanned chain round's, and a tree's price is scaled by the ratio of the two. Each planned
round is also set against the chain's round on the same drafts (read off the tree: `chain_taken`;
a planned round that chose the chain commits the same, after its wait); while this run's planned
rounds commit less per priced ms than those would have, or few planned rounds choose a tree,
rounds skip the planning (and its wait) and verify the chain as a chain run does, planning
again once every TRY_EVERY rounds (and while they plan, skip it once every TRY_EVERY rounds, so that
chain rounds stay timed too). docs/trees.md, "--tree auto".
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np

from engine.decode.cost_curve_data import CostCurve
from engine.decode.drafts import Proposal
from engine.decode.tree.layout import COPY_RANK, DraftTree, best_first, build_tree, ranked_candidates, top_candidates
from engine.decode.tree.walk import sampled_candidates

WIDTH = 4  # a v1 head's candidates per depth (DFlash2: the selector's own K)
DECAY = 0.97  # weight of a round's evidence after each newer round (as the chain's auto: ~30 rounds)
PRIOR = 2.0  # expected nodes of prior evidence, at a rate of 1 (the drafter's probabilities as they are)
# a round's measured time over its price on the curve, per kind (chain, tree): prior 1 as this many rounds
TIME_PRIOR = 2.0
# one round's ratio is held within this factor of both kinds' so far (a first shape's warm-up, a
# descheduled round); not to fixed bounds: a curve measured under another load is off by a factor
TIME_CLAMP = 3.0
CONSIDER_FROM = 0.2  # plan a tree while at least this share of recently planned rounds chose one
TRY_EVERY = 8  # once every this many rounds, the other way (planning or not)
MIN_TIMED = 1.5  # ...or every other round while planning, until about two chain rounds are timed


def candidates(proposal: Proposal, key: Optional[mx.array] = None, width: int = WIDTH
               ) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """(ids, log-probs, follow) per depth, best first, from a drafter's proposal, as build_tree takes
    them: (D, K) and None, or, for a DFlash2 selector at T = 0, (D, K, K) ranked after each possible
    predecessor (`selector_rows`). At T > 0 (`key`) the log-probs are still the ranked ones, which shape
    the tree, but the ids are K draws without replacement from the distribution the drafts were
    sampled from (walk.sampled_candidates): what the rejection sampling over siblings needs to stay
    exact."""
    s = proposal.selection
    if key is not None:  # one evaluation for both: the ranked scores and the draws
        width = s.candidates.shape[-1] if s is not None else width
        ranked, drawn = top_candidates(proposal.logq, width), sampled_candidates(proposal.logq, width, key)
        mx.eval(ranked, drawn)
        return best_first(*drawn)[0], best_first(*ranked)[1], None
    if s is None:
        return (*ranked_candidates(proposal.logits, width), None)
    return selector_rows(np.array(s.candidates, dtype=np.int64), s.after)


def selector_rows(candidates: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A DFlash2 selector's candidates (D, K) ranked after each predecessor: row [d, j] holds depth
    d + 1's candidates by their log-softmaxed score after candidate j at depth d (`after`, from the T = 0
    walk), and follow[d, j, r] the candidate index of its rank-r entry, the row its children read. So
    every node of the tree is scored as the selector scores it after its own parent, not only the
    greedy chain's. Equal scores keep candidate order, as the walk's argmax does: rank 0 all the way
    down is the walk's drafts."""
    scores = after.astype(np.float64)
    top = scores.max(axis=-1, keepdims=True)
    logq = scores - (top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True)))
    follow = np.argsort(-logq, axis=-1, kind="stable")
    ids = np.take_along_axis(np.broadcast_to(candidates[:, None, :], logq.shape), follow, axis=-1)
    return ids, np.take_along_axis(logq, follow, axis=-1), follow


def first_nodes(tree: DraftTree, n: int) -> DraftTree:
    """The tree of its first n draft nodes (parents come before children: still a tree)."""
    k = n + 1
    return DraftTree(tree.tokens[:k], tree.parents[:k], tree.depths[:k], tree.logq[:k], tree.scores[:k],
                     tree.ranks[:k])


def chain_taken(tree: DraftTree, path: list[int]) -> tuple[int, int]:
    """(the greedy chain's drafts in a verified tree, how many of them its round would have accepted):
    the path's first nodes while they are the chain's. At T = 0 exactly the chain's round on the same
    drafts (the walk follows the target's argmax, which left the chain where the path does); at T > 0
    the walk tries the chain's child first with the chain's own test, so it is the chain's in law."""
    chain = tree.on_chain
    taken = next((i for i, node in enumerate(path[1:]) if not chain[node]), len(path) - 1)
    return int(chain.sum()) - 1, taken


class TreePlanner:
    """A round's tree (or None: the chain) from the drafter's proposal; `budget` draft nodes, or auto."""

    def __init__(self, budget: int, auto: bool):
        self.budget, self.auto = budget, auto
        self.curve: Optional[CostCurve] = None
        # decayed evidence per kind of node [chain, off the chain]: accepted nodes, and expected ones
        self.accepted = [0.0, 0.0]
        self.expected = [0.0, 0.0]
        self.chain_q: Optional[np.ndarray] = None  # the planned round's chain: each draft's chance to be reached
        # per kind of round [the chain unplanned, planned: a tree or the chain]: decayed sums of measured
        # time over price, and of rounds timed
        self.ratios, self.timed_rounds = [0.0, 0.0], [0.0, 0.0]
        # over planned rounds, [the chain's round on the same drafts, the planned round's]: decayed tokens
        # and priced ms
        self.tokens, self.priced = [0.0, 0.0], [0.0, 0.0]
        self.planned = self.chose = 0.0  # decayed rounds planned, and of those the ones that chose a tree
        self.since = 0  # rounds since the way not taken (planning or not) was last tried
        self.at: Optional[CostCurve] = None  # the curve at this round's depth
        self.draft_ms = 0.0  # this round's draft on it

    @property
    def sizes_by_curve(self) -> bool:
        """--tree auto with a cost curve: the tree is sized per round, within the chain's draft.
        Otherwise (a budget, or no curve) a round drafts the whole block for its tree."""
        return self.auto and self.curve is not None

    def considers(self, position: int, length: int) -> bool:
        """Before the round drafts `length` positions (the chain's): whether it plans a tree at all. A
        planned round awaits its drafts before the verify is built; one that is not verifies the chain.
        Auto plans while the trees verified have paid (`trees_pay`) and recently planned rounds chose
        them (CONSIDER_FROM); every TRY_EVERY rounds it does the other (a chain round unplanned, or a
        tree planned), so that both kinds of round stay timed and trees are tried again; every other
        round while planning until about two chain rounds are timed (MIN_TIMED)."""
        if not self.sizes_by_curve:
            return True
        self.at = self.curve.at(position)
        self.draft_ms = self.at.draft_of(length)
        self.chain_q = None
        plan = self.trees_pay() and (self.chose + PRIOR) / (self.planned + PRIOR) >= CONSIDER_FROM
        self.since += 1
        # the other way, now and then: both kinds of round stay timed (the chain's soon, while it has
        # hardly been: until then a tree round's host work is measured against nothing)
        if self.since >= (TRY_EVERY if self.timed_rounds[0] >= MIN_TIMED or not plan else 2):
            self.since = 0
            return not plan
        return plan

    def trees_pay(self) -> bool:
        """Whether this run's planned rounds (trees, and the chain where planning chose it, after its
        wait) committed at least as many tokens per ms as the chain's rounds on the same drafts would
        have, unplanned (each priced on the curve and scaled by its kind's measured time)."""
        if self.priced[0] == 0.0:
            return True
        chain, tree = (t / (p * self.overhead(kind)) for kind, t, p in zip((False, True), self.tokens, self.priced))
        return tree >= chain

    def price(self, curve: CostCurve) -> None:
        self.curve = curve

    def rates(self) -> tuple[float, float]:
        """What this run accepted of the nodes it verified, per expected one: on the chain, off it."""
        return tuple((a + PRIOR) / (e + PRIOR) for a, e in zip(self.accepted, self.expected))

    def overhead(self, planned: bool) -> float:
        """A kind of round's (planned, or the chain's unplanned) measured time per ms of its price on the
        curve (decayed), its prior the two kinds' pooled (itself with a prior of 1): the same for both
        until a kind has been timed."""
        kind = int(planned)
        return (self.ratios[kind] + TIME_PRIOR * self.pooled()) / (self.timed_rounds[kind] + TIME_PRIOR)

    def pooled(self) -> float:
        """Both kinds' measured time per ms of price (decayed; prior 1)."""
        return (sum(self.ratios) + TIME_PRIOR) / (sum(self.timed_rounds) + TIME_PRIOR)

    def plan(self, anchor: int, proposal: Proposal, position: int, key: Optional[mx.array] = None
             ) -> Optional[DraftTree]:
        """The round's tree, or None for the chain (all of its drafts). `proposal` holds the drafter's
        block, evaluated here; `key` (T > 0) draws the tree's tokens. The tree's shape and whether it
        is verified at all depend on the drafter's scores, never on the draws."""
        ids, logq, follow = candidates(proposal, key)
        depth = ids.shape[0]
        if not self.sizes_by_curve:
            return build_tree(anchor, ids, logq, self.budget or depth, follow=follow)
        verify = np.array(self.at.verify_ms)
        most = max(depth, min(len(verify) - 1, depth + (self.budget or depth * ids.shape[-1])))
        tree = build_tree(anchor, ids, logq, most, chain=depth, follow=follow)  # the chain, then second choices
        main, side = self.rates()
        # the chance the chain's draft j is reached and taken: nodes 1..depth are the chain, in order
        self.chain_q = np.exp(tree.scores[1 : depth + 1].astype(np.float64))
        rows = 1 + depth  # the anchor and the chain; second choices after them, best first
        value = 1.0 + main * self.chain_q.sum() + np.concatenate(
            [[0.0], np.cumsum(np.exp(tree.scores[rows:].astype(np.float64)) * side)])
        cost = (self.draft_ms + verify[rows - 1 : len(tree)]) * self.overhead(True)
        cost[0] = (self.draft_ms + verify[rows - 1]) * self.overhead(False)
        extra = int(np.argmax(value / cost))
        self.planned = self.planned * DECAY + 1.0
        self.chose = self.chose * DECAY + float(extra > 0)
        return first_nodes(tree, depth + extra) if extra else None

    def record(self, tree: Optional[DraftTree], path: list[int], chain_drafts: int = 0,
               ms: Optional[float] = None) -> None:
        """A round's outcome: the tree it verified and the nodes accepted; a chain's round (tree None)
        verified `chain_drafts` drafts of the chain last planned and accepted len(path) - 1 of them
        (a chain round that was not planned tells nothing about the drafter's probabilities). `ms`:
        its measured time (draft, verify and commit), kept against its price on the curve."""
        rows = len(tree) if tree is not None else chain_drafts + 1
        # a planned round waited for its drafts to plan, tree or chain (a v1 chain round that does not
        # plan queues its verify behind them): timed as a planned round, never as the chain's
        planned = tree is not None or self.chain_q is not None
        timing = self.sizes_by_curve and self.at is not None
        if ms is not None and timing:
            kind, pooled = int(planned), self.pooled()
            ratio = min(max(ms / self.round_price(rows), pooled / TIME_CLAMP), pooled * TIME_CLAMP)
            self.ratios[kind] = self.ratios[kind] * DECAY + ratio
            self.timed_rounds[kind] = self.timed_rounds[kind] * DECAY + 1.0
        if tree is None:
            if planned:
                self._add(0, float(self.chain_q[:chain_drafts].sum()), len(path) - 1)
                if timing:  # planning bought nothing here but cost its wait: the same tokens, both ways
                    self._compare(len(path), len(path), self.round_price(rows), self.round_price(rows))
            return
        chain, copied = tree.on_chain, tree.ranks == COPY_RANK  # a grafted copy is neither kind
        expected = np.exp(tree.scores.astype(np.float64))[1:]
        hit = np.zeros(len(tree), dtype=bool)
        hit[path[1:]] = True
        for i, kind in enumerate((chain[1:], ~(chain | copied)[1:])):
            self._add(i, float(expected[kind].sum()), float(hit[1:][kind].sum()))
        # this tree round against the chain's on its drafts (with a copy grafted, a chain round might
        # have verified the copy: no comparison)
        if timing and not copied.any():
            drafts, taken = chain_taken(tree, path)
            self._compare(taken + 1, len(path), self.round_price(drafts + 1), self.round_price(rows))

    def _compare(self, chain_tokens: int, planned_tokens: int, chain_price: float, planned_price: float) -> None:
        """One planned round against the chain's round on the same drafts: tokens each commits, and
        each one's price on the curve (scaled by its kind's measured time in trees_pay)."""
        for i, (tokens, priced) in enumerate(((chain_tokens, chain_price), (planned_tokens, planned_price))):
            self.tokens[i] = self.tokens[i] * DECAY + tokens
            self.priced[i] = self.priced[i] * DECAY + priced

    def round_price(self, rows: int) -> float:
        """This round on the curve: its draft and a verify of `rows` rows."""
        verify = self.at.verify_ms
        return self.draft_ms + verify[min(rows, len(verify)) - 1]

    def _add(self, kind: int, expected: float, accepted: float) -> None:
        """One round's evidence for a kind of node (0: on the chain, 1: off it)."""
        self.expected[kind] = self.expected[kind] * DECAY + expected
        self.accepted[kind] = self.accepted[kind] * DECAY + accepted

