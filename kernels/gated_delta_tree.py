"""The gated delta rule over a draft tree: each node steps from its parent's state.

For node i with parent p(i) (the root's parent is the state before the tree):

    S_i = g_i * S_p(i) + k_i (x) delta_i,   delta_i = (v_i - (g_i * S_p(i)) k_i) * beta_i,   y_i = S_i q_i

The reference's own compiled step (gated_delta_ref.py) runs once per depth, over all nodes at that
depth as a batch, so a node's output and innovation are those of a stepwise pass over its
root-to-node path, bit for bit. On the CPU, with one gate per head, `gated_delta_tree` takes the
closed-form chunked pass instead (gated_delta_chunked.py) with the tree's ancestor mask in place of
the causal one: one triangular solve for the whole tree, rounding as the chain's chunked verify does.
The innovations form the tape: replaying the accepted path's (k, g, delta) with `tape_replay` gives
the state after that path, as the chain's rollback does.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np

from kernels.gated_delta_chunked import token_major
from kernels.gated_delta_ref import _decay_innovation, _per_value_head, _update_ops


def ancestor_matrix(parents: np.ndarray) -> np.ndarray:
    """(N, N) booleans: [i, j] when node j is node i or one of its ancestors. A node's row is its
    parent's row and itself (parents come first): one row copy per node, cheaper on the host than a
    pass of array ops per generation at the few dozen nodes a tree has."""
    parents = np.asarray(parents, dtype=np.int64)
    n = len(parents)
    seen = np.zeros((n, n), dtype=bool)
    for node, parent in enumerate(parents.tolist()):
        if parent >= node:
            raise ValueError(f"tree: node {node}'s parent {parent} does not come before it.")
        if parent >= 0:
            seen[node] = seen[parent]
        seen[node, node] = True
    return seen


def tree_levels(parents: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per depth: (the nodes at that depth, each one's parent as an index into the previous depth's
    nodes; -1 at depth 0). Parents come before their children."""
    parents = np.asarray(parents, dtype=np.int64)
    depth = np.zeros(len(parents), dtype=np.int64)
    for node, parent in enumerate(parents):
        if parent >= node:
            raise ValueError(f"tree: node {node}'s parent {parent} does not come before it.")
        depth[node] = depth[parent] + 1 if parent >= 0 else 0
    levels, where = [], np.full(len(parents), -1, dtype=np.int64)
    for d in range(int(depth.max()) + 1 if len(parents) else 0):
        nodes = np.flatnonzero(depth == d)
        where[nodes] = np.arange(len(nodes))
        levels.append((nodes, where[parents[nodes]] if d else np.full(len(nodes), -1, dtype=np.int64)))
    return levels


@mx.compile
def _level_step(previous: mx.array, up: mx.array, q: mx.array, k: mx.array, v: mx.array, g: mx.array,
                beta: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """One depth's nodes stepped from their parents' states (rows `up` of `previous`): the reference's
    decay, innovation, update and readout, as one compiled call."""
    decayed, delta = _decay_innovation(mx.take(previous, up, axis=0), g, k, v, beta)
    state = _update_ops(decayed, k, delta)
    return state, (state * q[..., None, :]).sum(axis=-1), delta


def gated_delta_tree_ref(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array,
                         parents: np.ndarray) -> tuple[mx.array, mx.array]:
    """(y [1, N, Hv, Dv] in q's dtype, delta [1, N, Hv, Dv] fp32) for the N nodes of a tree (batch of one).

    q, k: [1, N, Hk, Dk]; v: [1, N, Hv, Dv]; g: [1, N, Hv] or [1, N, Hv, Dk]; beta: [1, N, Hv];
    state: [1, Hv, Dv, Dk], the state before the tree; parents[i] < i, -1 for the root(s).
    """
    if q.shape[0] != 1:
        raise ValueError(f"tree gated delta: a batch of one was expected, got {q.shape[0]}.")
    Hv = v.shape[-2]
    levels = tree_levels(parents)
    order = np.concatenate([nodes for nodes, _ in levels])  # nodes by depth: each depth a contiguous run
    by_depth = mx.array(order, dtype=mx.int32)
    q, k, v, g, beta = (x[0][by_depth] for x in (_per_value_head(q, Hv), _per_value_head(k, Hv), v, g, beta))
    ys, deltas, previous, start = [], [], state, 0
    for nodes, up in levels:
        end = start + len(nodes)
        previous, y, delta = _level_step(previous, mx.array(np.maximum(up, 0), dtype=mx.int32), q[start:end],
                                         k[start:end], v[start:end], g[start:end], beta[start:end])
        ys.append(y)
        deltas.append(delta)
        start = end
    back = mx.array(np.argsort(order), dtype=mx.int32)  # depth order -> node order
    return mx.concatenate(ys)[back][None].astype(q.dtype), mx.concatenate(deltas)[back][None]


# One compiled closed-form pass per tree size: the chain's chunk with the ancestor mask (no final state).
_tree_chunk = mx.compile(lambda q, k, v, g, beta, state, seen: token_major(q, k, v, g, beta, state, seen)[::2])


def gated_delta_tree(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array,
                     parents: np.ndarray, seen: Optional[mx.array] = None) -> tuple[mx.array, mx.array]:
    """As gated_delta_tree_ref; on the CPU with one gate per head, the closed-form pass over the tree.
    seen: ancestor_matrix(parents) as an MLX array, where the caller made it once for many layers."""
    if g.ndim == 3 and mx.default_device() == mx.cpu and len(parents) > 1:
        if seen is None:  # ancestor_matrix checks parents come before children: the system is lower triangular
            seen = mx.array(ancestor_matrix(parents))
        return _tree_chunk(q, k, v, g, beta, state, seen)
    return gated_delta_tree_ref(q, k, v, g, beta, state, parents)
