"""GatedDeltaNet layers over a draft tree: per node, the state of its parent and its ancestors' conv rows.

Inside `tree_block(TreeRows(parents))` (the tree verify opens it, engine/decode/tree/verify.py) a taped
GatedDeltaNet layer (engine/models/gdn_tape.py) runs the tree's N rows as N paths, not one sequence:
- its short causal conv reads, for each node, the node and its K-1 nearest ancestors (the conv state
  from before the tree where the path is shorter), `conv_windows`;
- its recurrence steps each node from its parent's state (kernels/gated_delta_tree.py).
What the layers read of the tree's shape (`TreeRows`: the ancestor mask, the conv rows) is made once per
verify and shared by all of them.
The layer's cache keeps the state from before the tree and gets the block's tape (`GDNTape`: that
state, the conv input, and per node k, g and the innovation delta). `commit_path` then gives the cache
the conv rows and the state after the accepted path, by replaying that path's taped steps: the
stepwise arithmetic a chain's rollback and AR's single steps use.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import DFlashError
from kernels.gated_delta_ref import tape_replay_ref
from kernels.gated_delta_tree import ancestor_matrix

PENDING = "tree_tape"  # the attribute of a GatedDeltaNet cache holding a tree block's tape until its commit


class TreeRows:
    """A tree's shape as its verify's layers read it, made once per verify from `parents` (parents[i] < i,
    -1 at the root): `ancestors` (N, N), [i, j] when j is i or an ancestor of i; `seen`, the same as an
    MLX array (the attention mask's tree part, the closed-form recurrence's mask); `conv_rows(keep)`."""

    def __init__(self, parents: np.ndarray):
        self.parents = np.asarray(parents, dtype=np.int64)
        self.ancestors = ancestor_matrix(self.parents)
        self.seen = mx.array(self.ancestors)
        self._conv: dict[int, mx.array] = {}

    def __len__(self) -> int:
        return len(self.parents)

    def conv_rows(self, keep: int) -> mx.array:
        """(N, keep + 1) int32: per node, the rows of [conv state (keep rows); the tree's N rows] a causal
        pass over its root-to-node path sees last (path_rows(path, keep, keep + 1)), oldest first."""
        if keep not in self._conv:
            n = len(self)
            depth = self.ancestors.sum(axis=1) - 1
            rows = np.empty((n, keep + 1), dtype=np.int64)
            up = np.arange(n)  # each node's ancestor j generations up (-1 past the root)
            for j in range(keep + 1):
                # within the path: that ancestor's tree row; above the root: the conv state's rows, newest first
                rows[:, keep - j] = np.where(up >= 0, keep + up, keep - j + depth)
                up = np.where(up >= 0, self.parents[np.maximum(up, 0)], -1)
            self._conv[keep] = mx.array(rows, dtype=mx.int32)
        return self._conv[keep]


# the tree whose nodes the current forward's rows are; set only inside `tree_block()`
_ACTIVE_TREE: ContextVar[Optional[TreeRows]] = ContextVar("dflash_active_tree", default=None)


@contextmanager
def tree_block(tree: TreeRows) -> Iterator[None]:
    token = _ACTIVE_TREE.set(tree)
    try:
        yield
    finally:
        _ACTIVE_TREE.reset(token)


def active_tree() -> Optional[TreeRows]:
    """The tree being verified, None outside a tree forward."""
    return _ACTIVE_TREE.get()


def path_rows(path: list[int], keep: int, width: int) -> list[int]:
    """The last `width` rows, in [conv state (keep rows); the tree's rows], of the sequence a causal pass
    over `path` (root to node) would have seen."""
    return ([*range(keep), *(keep + node for node in path)])[-width:]


def conv_windows(conv: nn.Module, conv_input: mx.array, tree: TreeRows, keep: int) -> mx.array:
    """The conv's output [1, N, C] at every node, each over its own ancestors' rows. conv_input:
    [1, keep + N, C], the conv state before the tree then the N nodes' projections."""
    windows = conv_input[0][tree.conv_rows(keep)]  # [N, K, C]
    return conv(windows).reshape(1, len(tree), -1)


def commit_path(caches: list, path: list[int]) -> list[mx.array]:
    """Give GatedDeltaNet layers' caches the conv rows and the state after `path` (root first) of the
    tree they verified; the arrays set (to evaluate). Layers of one shape replay as one batch."""
    tapes = [cache.__dict__.pop(PENDING, None) for cache in caches]
    if any(tape is None for tape in tapes):
        raise DFlashError("tree verify: a GatedDeltaNet layer ran without recording its tree tape; "
                          "cannot commit its state.")
    groups: dict[tuple, list[int]] = {}
    for i, tape in enumerate(tapes):
        groups.setdefault((tape.state.shape, tape.k.shape, tape.g.shape, tape.conv_input.shape), []).append(i)
    idx, out = mx.array(path, dtype=mx.int32), []
    for members in groups.values():
        tape = tapes[members[0]]
        keep = tape.conv_input.shape[1] - tape.k.shape[1]
        rows = mx.array(path_rows(path, keep, keep), dtype=mx.int32)
        joined = {name: mx.concatenate([getattr(tapes[i], name) for i in members]) if len(members) > 1
                  else getattr(tape, name) for name in ("state", "conv_input", "k", "g", "delta")}
        conv = mx.contiguous(joined["conv_input"][:, rows])
        state = tape_replay_ref(joined["state"], joined["k"][:, idx], joined["g"][:, idx], joined["delta"][:, idx])
        for j, i in enumerate(members):
            caches[i][0], caches[i][1] = conv[j : j + 1], state[j : j + 1]
            out += [caches[i][0], caches[i][1]]
    return out
