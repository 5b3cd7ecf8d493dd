"""A draft tree through the target in one forward, and the KV cache kept to the accepted path.

mlx-lm's attention layers take their RoPE offset and their mask from the cache: `self.rope(x,
offset=cache.offset)`, and the model's `create_attention_mask(h, cache)` asks the cache's
`make_mask`. For one forward `tree_inputs` replaces both: each attention layer's RoPE places row i
at the prefix plus node i's depth (the same MLX rope, one row per batch entry), and each cache's
mask is the tree's ancestor-only one (with the layer's sliding window where it has one). Keys and
values of all nodes enter the cache at consecutive slots; `compact` then moves the accepted path's
rows to the slots after the prefix and drops the rest, so the cache is what AR over the accepted
tokens would have left.

Attention-only targets with plain KV caches. A recurrent (GatedDeltaNet) layer would need its state
per node (a tape along each branch), which is not built: such targets are refused.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import mlx.core as mx
import mlx.nn as nn

from engine.decode.tree.layout import DraftTree, attention_mask
from engine.errors import DFlashError


class RowRoPE(nn.Module):
    """A layer's RoPE with its own position per query row: rows go to the batch axis, one position each."""

    def __init__(self, rope: nn.Module, positions: mx.array):
        super().__init__()
        self.rope = rope
        self.positions = positions

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if x.shape[0] != 1 or x.shape[-2] != self.positions.shape[0]:
            raise DFlashError(f"tree verify: a batch of one over {self.positions.shape[0]} nodes was expected, "
                              f"got attention input {tuple(x.shape)}.")
        return self.rope(x.swapaxes(0, -2), offset=self.positions).swapaxes(0, -2)


def _tree_caches(cache: list) -> list:
    from mlx_lm.models.cache import KVCache

    for i, c in enumerate(cache):
        if type(c) is not KVCache:
            raise DFlashError(f"tree verify: the target's layer {i} keeps a {type(c).__name__}, not a plain "
                              "KV cache; trees need attention-only targets (no recurrent or quantized caches).")
    return cache


def _rope_holders(model: nn.Module) -> list[nn.Module]:
    holders = [m for m in model.modules() if isinstance(m.get("rope") if isinstance(m, dict) else None, nn.Module)]
    if not holders:
        raise DFlashError(f"tree verify: target model type '{getattr(model, 'model_type', type(model).__name__)}' "
                          "has no attention layer with a `rope` of its own to place the tree's positions.")
    return holders


@contextmanager
def tree_inputs(model: nn.Module, cache: list, tree: DraftTree, prefix: int) -> Iterator[None]:
    """Inside this block a forward of the tree's N tokens (batch of one) over `cache` (holding
    `prefix` positions) gives node i the position prefix + depth and the ancestor-only mask."""
    caches = _tree_caches(cache)
    holders = _rope_holders(model)
    positions = mx.array(tree.positions(prefix), dtype=mx.int32)
    n = len(tree)

    def make_mask(rows: int, return_array: bool = False, window_size: Optional[int] = None) -> mx.array:
        if rows != n:
            raise DFlashError(f"tree verify: a forward of {rows} rows over a tree of {n} nodes.")
        return attention_mask(tree, prefix, window_size)

    ropes = [h.rope for h in holders]
    try:
        for h, rope in zip(holders, ropes):
            h.rope = RowRoPE(rope, positions)
        for c in caches:
            c.make_mask = make_mask
        yield
    finally:
        for h, rope in zip(holders, ropes):
            h.rope = rope
        for c in caches:
            c.__dict__.pop("make_mask", None)


def tree_forward(model: nn.Module, cache: list, tree: DraftTree) -> mx.array:
    """The target's logits (N, V) at every node of the tree (graph only); the cache grows by N."""
    prefix = _tree_caches(cache)[0].offset
    with tree_inputs(model, cache, tree, prefix):
        return model(mx.array(tree.tokens, dtype=mx.int32)[None], cache=cache)[0]


def compact(cache: list, prefix: int, path: list[int]) -> None:
    """Keep the K/V rows of `path` (nodes from the root, as slots after `prefix`) at consecutive slots
    from `prefix`, and drop the rest of the tree's rows."""
    keep = mx.array([prefix + node for node in path], dtype=mx.int32)
    end = prefix + len(path)
    for c in _tree_caches(cache):
        if path != list(range(len(path))):  # a prefix of the flat order is already in place
            c.keys[..., prefix:end, :] = mx.take(c.keys, keep, axis=2)
            c.values[..., prefix:end, :] = mx.take(c.values, keep, axis=2)
        c.offset = end
