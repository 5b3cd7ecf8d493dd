"""GatedDeltaNet layers over a draft tree: per node, the state of its parent and its ancestors' conv rows.

Inside `tree_block(parents)` (the tree verify opens it, engine/decode/tree/verify.py) a taped
GatedDeltaNet layer (engine/models/gdn_tape.py) runs the tree's N rows as N paths, not one sequence:
- its short causal conv reads, for each node, the node and its K-1 nearest ancestors (the conv state
  from before the tree where the path is shorter), `conv_windows`;
- its recurrence steps each node from its parent's state (kernels/gated_delta_tree.py).
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

# the parents of the tree whose nodes the current forward's rows are; set only inside `tree_block()`
_ACTIVE_TREE: ContextVar[Optional[np.ndarray]] = ContextVar("dflash_active_tree", default=None)

PENDING = "tree_tape"  # the attribute of a GatedDeltaNet cache holding a tree block's tape until its commit


@contextmanager
def tree_block(parents: np.ndarray) -> Iterator[None]:
    token = _ACTIVE_TREE.set(np.asarray(parents, dtype=np.int64))
    try:
        yield
    finally:
        _ACTIVE_TREE.reset(token)


def active_tree() -> Optional[np.ndarray]:
    """The parents of the tree being verified, None outside a tree forward."""
    return _ACTIVE_TREE.get()


def path_rows(path: list[int], keep: int, width: int) -> list[int]:
    """The last `width` rows, in [conv state (keep rows); the tree's rows], of the sequence a causal pass
    over `path` (root to node) would have seen."""
    return ([*range(keep), *(keep + node for node in path)])[-width:]


def conv_windows(conv: nn.Module, conv_input: mx.array, parents: np.ndarray, keep: int) -> mx.array:
    """The conv's output [1, N, C] at every node, each over its own ancestors' rows. conv_input:
    [1, keep + N, C], the conv state before the tree then the N nodes' projections."""
    rows, paths = [], {}
    for node, parent in enumerate(parents.tolist()):
        paths[node] = (paths[parent] if parent >= 0 else []) + [node]
        rows.append(path_rows(paths[node], keep, keep + 1))
    windows = conv_input[0][mx.array(rows, dtype=mx.int32)]  # [N, K, C]
    return conv(windows).reshape(1, len(rows), -1)


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
