"""Which path of a verified tree is committed, and the token after it.

Greedy (T = 0): from the root, follow the child whose token is the target's argmax at the node; the
argmax where no child matches is the bonus. At T > 0, recursive rejection sampling over siblings:
at each node the children are tried in order, each against a residual of the target's distribution
p; the first accepted one is moved to, and where every child is rejected the correction is drawn from
what is left of p. The committed tokens are then distributed exactly as the target's own samples.

A child is a proposal from one of two distributions, and each is tested against its own:
- a *sampled* child was drawn, in order and without replacement with its sampled siblings, from the
  drafter's distribution q at its depth (`sampled_candidates`): it is tested against q with the
  siblings tried before it removed;
- any other child (a top-k candidate, a lookup copy) is a fixed token: a point mass, accepted with
  the residual's own probability of that token.
For the result to be exact, the tree's shape must not depend on which tokens were sampled: build it
from the drafter's deterministic scores and fill the ranks with the sampled tokens.
"""

from __future__ import annotations

from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

from engine.decode.tree.layout import COPY_RANK, DraftTree, top_ids


def greedy_walk(tree: DraftTree, choice: Sequence[int]) -> tuple[list[int], int]:
    """(accepted path of nodes from the root, bonus token): choice[i] is the target's argmax at node i."""
    index = tree.child_index()
    path = [0]
    while True:
        token = int(choice[path[-1]])
        nxt = index.get((path[-1], token))
        if nxt is None:
            return path, token
        path.append(nxt)


def leftmost_leaf(tree: DraftTree, node: int) -> int:
    """The leaf reached from `node` by first children (the best-ranked continuation past a path's end)."""
    first = {}
    for child in range(len(tree) - 1, 0, -1):
        first[int(tree.parents[child])] = child
    while node in first:
        node = first[node]
    return node


def sampled_candidates(logq: mx.array, k: int, key: mx.array) -> tuple[mx.array, mx.array]:
    """(ids, keys) (D, k), graph only: per row, k draws without replacement from softmax(logq), by the
    Gumbel top-k trick (the k largest of logq + Gumbel noise, their keys those noisy values).
    layout.best_first puts them in draw order (descending key) once evaluated."""
    noisy = logq.astype(mx.float32) + mx.random.gumbel(logq.shape, key=key)
    idx = top_ids(noisy, k)
    return idx, mx.take_along_axis(noisy, idx, axis=-1)


class HostRows:
    """Rows of an MLX array as NumPy, each made when read: one per node, or through `index` (e.g.
    the drafter's rows by depth: tree.depths)."""

    def __init__(self, rows: mx.array, index: Optional[np.ndarray] = None):
        self.rows, self.index = rows, index

    def __getitem__(self, node: int) -> np.ndarray:
        return np.array(self.rows[int(node if self.index is None else self.index[node])])


class TargetRows:
    """The target's sampling distribution after each node (its logits filtered and tempered as the run
    samples), one full-vocabulary row made on the host when read: the walk reads a row per depth."""

    def __init__(self, logits: mx.array, settings):
        self.logits, self.settings = logits, settings

    def __getitem__(self, node: int) -> np.ndarray:
        from engine.decode.sampling import log_probs

        return np.array(mx.exp(log_probs(self.logits[int(node)][None], self.settings))[0])


def sampled_walk(sampler, tree: DraftTree, target_logits: mx.array, draft_logq: mx.array) -> tuple[list[int], int]:
    """tree_rejection_sample for a round at T > 0: the target's rows from its logits at the nodes, the
    drafter's from the log-probs its tokens were drawn from (by depth), the random numbers from the
    run's sampler (so a seed repeats the run)."""
    seed = int(mx.random.randint(0, 2**31 - 1, key=sampler.next_key()).item())
    draft = HostRows(mx.exp(draft_logq), tree.depths)
    return tree_rejection_sample(tree, TargetRows(target_logits, sampler.s), draft, tree.ranks != COPY_RANK,
                                 np.random.default_rng(seed))


def _residual(p: np.ndarray, proposal: np.ndarray) -> np.ndarray:
    """norm(max(p - proposal, 0)): what p has left once a proposal from `proposal` was rejected."""
    left = np.maximum(p - proposal, 0.0)
    total = left.sum()
    return left / total if total > 0 else p


def _without(q: np.ndarray, token: int) -> np.ndarray:
    """q with `token` taken out (a sampled sibling tried): the distribution the next one was drawn from."""
    q = q.copy()
    q[token] = 0.0
    return q


def _draw(p: np.ndarray, rng: np.random.Generator) -> int:
    return int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"), p.shape[0] - 1))


def tree_rejection_sample(tree: DraftTree, target_probs, draft_probs, sampled: Optional[np.ndarray],
                          rng: np.random.Generator) -> tuple[list[int], int]:
    """(accepted path of nodes from the root, correction or bonus token) at T > 0.
    target_probs[i]: the target's distribution (1-D, sums to 1) after node i; draft_probs[i]: the
    drafter's distribution node i's sampled children were drawn from (read only where it has some);
    sampled[i]: whether node i was sampled (None: none was). Rows are read only along the walk, so
    they may be lazy (e.g. rows of an MLX array turned to NumPy on access)."""
    path = [0]
    while True:
        node = path[-1]
        p = np.asarray(target_probs[node], dtype=np.float64)
        q = None
        moved = False
        for child in tree.children(node):
            token = int(tree.tokens[child])
            if sampled is not None and sampled[child]:
                if q is None:
                    q = np.asarray(draft_probs[node], dtype=np.float64)
                proposal = q / q.sum()
                q = _without(q, token)
            else:
                proposal = np.zeros_like(p)
                proposal[token] = 1.0
            if proposal[token] > 0 and rng.random() * proposal[token] < p[token]:
                path.append(child)
                moved = True
                break
            p = _residual(p, proposal)
        if not moved:
            return path, _draw(p, rng)
