"""The flat draft tree: node 0 is the round's anchor (the root), every other node a draft token.

Nodes are stored in the order they were added, so a parent always comes before its children and
siblings come in rank order. Host work per round is over the tree's own nodes (a budget of at most
a few dozen), never over the prefix: the part of the mask that covers the context is built by MLX.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

from engine.decode.top_k import top_k_indices
from kernels.gated_delta_tree import ancestor_matrix

COPY_RANK = -1  # the rank of a node grafted from a lookup copy (not one of the drafter's candidates)


@dataclass(frozen=True)
class DraftTree:
    """parents[0] = -1 (the root); depths[0] = 0; logq: the drafter's log-prob of each node's token at
    its depth (0 at the root and at copy nodes); scores: summed logq from the root; ranks: the token's
    rank among the drafter's candidates at its depth, COPY_RANK for a grafted copy."""

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    logq: np.ndarray
    scores: np.ndarray
    ranks: np.ndarray

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def child_index(self) -> dict[tuple[int, int], int]:
        """(parent, token) -> node, for walks (the first such child where a copy duplicates one)."""
        index: dict[tuple[int, int], int] = {}
        for node in range(len(self) - 1, 0, -1):
            index[(int(self.parents[node]), int(self.tokens[node]))] = node
        return index

    @cached_property
    def on_chain(self) -> np.ndarray:
        """Per node: whether it is on the greedy chain (rank 0 all the way from the root). Computed
        once per tree: a round's planner and its statistics each read it."""
        chain = np.zeros(len(self), dtype=bool)
        chain[0] = True
        for node in range(1, len(self)):
            chain[node] = self.ranks[node] == 0 and chain[self.parents[node]]
        return chain

    def children(self, node: int) -> list[int]:
        """Children of `node` in the order they were added (siblings by rank, a copy last)."""
        return np.flatnonzero(self.parents == node).tolist()

    def ancestors(self) -> np.ndarray:
        """(N, N) booleans: [i, j] when j is i or one of i's ancestors."""
        return ancestor_matrix(self.parents)

    def positions(self, prefix: int) -> np.ndarray:
        """Position ids of the nodes when the root sits at absolute position `prefix`."""
        return prefix + self.depths

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root to `node`, both included."""
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(int(self.parents[path[-1]]))
        return path[::-1]


def build_tree(anchor: int, ids: np.ndarray, logq: np.ndarray, budget: int, chain: int = 0,
               follow: Optional[np.ndarray] = None) -> DraftTree:
    """Best-first tree of at most `budget` draft nodes. ids[d, r] is the drafter's rank-r token for
    depth d + 1, logq[d, r] its score (descending along r; -inf: never taken). Prefixes are scored by
    their summed logq and taken from a heap: each taken node offers its next sibling (rank r + 1 at
    its depth) and its first child (rank 0 at the next depth). `chain` greedy nodes go in first
    (--tree auto: the chain it would verify), so the tree holds that much of it whatever the scores.

    Where a node's children depend on its own token (a DFlash2 selector scores each candidate after
    its predecessor), ids and logq are (D, C, K): row [d, c] ranks the depth-d + 1 candidates after a
    parent of context c, and follow[d, c, r] is the context that rank-r child gives its own children
    (the root's context is 0)."""
    if logq.shape != ids.shape or (follow is not None and follow.shape != ids.shape):
        raise ValueError(f"tree candidates: ids {ids.shape}, log-probs {logq.shape} and contexts "
                         f"{None if follow is None else follow.shape} differ in shape.")
    if ids.ndim == 2:  # one row per depth, whatever the parent
        ids, logq = ids[:, None, :], logq[:, None, :]
    depth_max, _, width = ids.shape
    contexts = (np.zeros(ids.shape, dtype=np.int64) if follow is None else follow).tolist()
    rows, ids = np.asarray(logq, dtype=np.float64).tolist(), np.asarray(ids).tolist()  # lists: cheap per item
    tokens, parents, depths, lq, scores, ranks, context = [anchor], [-1], [0], [0.0], [0.0], [0], [0]
    heap: list[tuple[float, int, int, int, int]] = []
    order = 0

    def offer(d: int, r: int, parent: int) -> None:
        nonlocal order
        if d < depth_max and r < width:
            score = scores[parent] + rows[d][context[parent]][r]
            if score > -math.inf:
                heapq.heappush(heap, (-score, order, d, r, parent))
                order += 1

    def take(d: int, r: int, parent: int) -> int:
        c = context[parent]
        tokens.append(ids[d][c][r])
        parents.append(parent)
        depths.append(d + 1)
        lq.append(rows[d][c][r])
        scores.append(scores[parent] + rows[d][c][r])
        ranks.append(r)
        context.append(contexts[d][c][r])
        offer(d, r + 1, parent)
        return len(tokens) - 1

    budget = max(0, int(budget))
    seeded = min(chain, budget, depth_max)
    node = 0
    for d in range(seeded):
        node = take(d, 0, node)
    offer(seeded, 0, node)
    while heap and len(tokens) - 1 < budget:
        _, _, d, r, parent = heapq.heappop(heap)
        node = take(d, r, parent)
        offer(d + 1, 0, node)
    return DraftTree(tokens=np.array(tokens, dtype=np.int64), parents=np.array(parents, dtype=np.int64),
                     depths=np.array(depths, dtype=np.int64), logq=np.array(lq, dtype=np.float32),
                     scores=np.array(scores, dtype=np.float32), ranks=np.array(ranks, dtype=np.int64))


def graft(tree: DraftTree, copy: Sequence[int]) -> DraftTree:
    """The tree with a lookup copy (the tokens after the anchor) inserted as a branch: it follows
    existing nodes while their tokens match and adds the rest."""
    index = tree.child_index()
    node, added = 0, []
    parents, depths, scores = list(tree.parents), list(tree.depths), list(tree.scores)
    for token in copy:
        found = index.get((node, int(token)))
        if found is None:
            found = len(parents)
            parents.append(node)
            depths.append(depths[node] + 1)
            scores.append(scores[node])
            added.append(int(token))
            index[(node, int(token))] = found
        node = found
    if not added:
        return tree
    k = len(added)
    return DraftTree(tokens=np.concatenate([tree.tokens, np.array(added, dtype=np.int64)]),
                     parents=np.array(parents, dtype=np.int64), depths=np.array(depths, dtype=np.int64),
                     logq=np.concatenate([tree.logq, np.zeros(k, np.float32)]),
                     scores=np.array(scores, dtype=np.float32),
                     ranks=np.concatenate([tree.ranks, np.full(k, COPY_RANK, dtype=np.int64)]))


def top_ids(x: mx.array, k: int) -> mx.array:
    """Indices of each row's k largest entries in no particular order (graph only; top_k.top_k_indices,
    so a 150k-token row is never sorted or partitioned whole); every index where k reaches the row."""
    if k < x.shape[-1]:
        return top_k_indices(x, k)
    return mx.broadcast_to(mx.arange(x.shape[-1]), x.shape)


def top_candidates(logits: mx.array, k: int) -> tuple[mx.array, mx.array]:
    """(ids, log-probs) (D, k) of each row's k most likely tokens of a drafter's logits (D, V), in no
    particular order (graph only: best_first orders them once evaluated)."""
    logits = logits.astype(mx.float32)
    idx = top_ids(logits, k)
    return idx, mx.take_along_axis(logits, idx, axis=-1) - mx.logsumexp(logits, axis=-1, keepdims=True)


def best_first(ids: mx.array, keys: mx.array) -> tuple[np.ndarray, np.ndarray]:
    """(ids, keys) (evaluated, D x k) as NumPy, each row by descending key; equal keys by ascending
    token id, as argmax and a stable sort of the whole row take them (so rank 0 is the row's argmax)."""
    ids, keys = np.array(ids, dtype=np.int64), np.array(keys, dtype=np.float64)
    order = np.lexsort((ids, -keys), axis=-1)
    return np.take_along_axis(ids, order, axis=-1), np.take_along_axis(keys, order, axis=-1)


def ranked_candidates(logits: mx.array, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, log-probs) of each row's k most likely tokens, best first, as NumPy (D, k): the input
    build_tree takes from a drafter's per-position logits (D, V). Only D x k numbers reach the host.
    (Which of several tokens tied at the k-th largest is kept is top_k_indices' choice.)"""
    ids, logq = top_candidates(logits, k)
    mx.eval(ids, logq)
    return best_first(ids, logq)


def attention_mask(tree: DraftTree, prefix: int, window: Optional[int] = None,
                   seen: Optional[mx.array] = None) -> mx.array:
    """(N, prefix + N) booleans for the tree's verify: a node sees the whole context and its own
    ancestors (itself included). With a sliding `window`, also only keys less than `window`
    positions behind it. The context part is made by MLX, not on the host. seen: tree.ancestors()
    as an MLX array, where the caller already has it (a verify makes it once for all its layers)."""
    n = len(tree)
    seen = mx.array(tree.ancestors()) if seen is None else seen
    context = mx.concatenate([mx.ones((n, prefix), dtype=mx.bool_), seen], axis=1)
    if window is None:
        return context
    positions = mx.array(tree.positions(prefix))
    keys = mx.concatenate([mx.arange(prefix), positions])[None, :]
    return context & (positions[:, None] - keys < window)
