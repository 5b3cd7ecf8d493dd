"""A draft tree through the target in one forward, and the KV cache kept to the accepted path.

mlx-lm's attention layers take their RoPE offset and their mask from the cache: `self.rope(x,
offset=cache.offset)`, and the model's `create_attention_mask(h, cache)` asks the cache's
`make_mask`. For one forward `TreeVerifier.inputs` replaces both: each attention layer's RoPE places row i
at the prefix plus node i's depth (the layer's own rope; on the CPU its cosines made once per verify:
engine/decode/tree/rope.py), and each cache's mask is the tree's ancestor-only one (with the layer's
sliding window where it has one). Keys and values of all nodes enter the cache at consecutive slots;
`compact` then moves the accepted path's rows to the slots after the prefix and drops the rest, so
the cache is what AR over the accepted tokens would have left.

Hybrid targets too: a GatedDeltaNet layer steps each node from its parent's state and reads its
ancestors' conv rows (engine/models/gdn_tree.py); `compact` gives it the state after the accepted
path, replayed from the tree's tape. Quantized or other caches are refused.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import mlx.core as mx
import mlx.nn as nn

from engine.decode.tree.layout import DraftTree, attention_mask
from engine.decode.tree.rope import RowAngles, RowRoPE
from engine.errors import DFlashError
from engine.models.gdn_tape import gdn_layers, instrument
from engine.models.gdn_tree import TreeRows, commit_path, tree_block
from kernels.cpu_rope import rope_holders


def tree_cache_refusal(model: nn.Module, cache: list) -> Optional[str]:
    """Why a tree cannot be verified over these caches (None: it can): every layer needs a plain KV
    cache or, for a GatedDeltaNet layer, its state."""
    from mlx_lm.models.cache import ArraysCache, KVCache

    recurrent = {i for i, _ in gdn_layers(model)}
    for i, c in enumerate(cache):
        if type(c) is not KVCache and not (i in recurrent and type(c) is ArraysCache):
            return (f"needs plain KV caches (and GatedDeltaNet states); the target's layer {i} keeps a "
                    f"{type(c).__name__}")
    if all(i in recurrent for i in range(len(cache))):
        return "needs at least one attention layer with a plain KV cache"
    return None


def _rope_holders(model: nn.Module) -> list[nn.Module]:
    holders = rope_holders(model)
    if not holders:
        raise DFlashError(f"tree verify: target model type '{getattr(model, 'model_type', type(model).__name__)}' "
                          "has no attention layer with a `rope` of its own to place the tree's positions.")
    return holders


class TreeVerifier:
    """Tree verifies of `model` over one run's `cache`: the caches are split (attention layers' KV caches,
    GatedDeltaNet layers' states) and the modules whose RoPE places the rows found once, when it is made
    (the run's first tree round), not every round."""

    def __init__(self, model: nn.Module, cache: list):
        refusal = tree_cache_refusal(model, cache)
        if refusal:
            raise DFlashError(f"tree verify: a draft tree {refusal}.")
        recurrent = {i for i, _ in gdn_layers(model)}
        self.model, self.cache = model, cache
        self.kv = [c for i, c in enumerate(cache) if i not in recurrent]
        self.states = [c for i, c in enumerate(cache) if i in recurrent]
        self.holders = _rope_holders(model)
        self.row_ropes = [RowRoPE(h.rope) for h in self.holders]
        if self.states:
            instrument(model)  # idempotent: the GatedDeltaNet layers take the tree's parents per node

    @contextmanager
    def inputs(self, tree: DraftTree, prefix: int) -> Iterator[None]:
        """Inside this block a forward of the tree's N tokens (batch of one) over the cache (holding
        `prefix` positions) gives node i the position prefix + depth and the ancestor-only mask. The
        tree's ancestor mask and conv rows are made once here for every layer, each mask once per window."""
        rows = TreeRows(tree.parents)
        positions = mx.array(tree.positions(prefix), dtype=mx.int32)
        n, masks = len(tree), {}

        def make_mask(length: int, return_array: bool = False, window_size: Optional[int] = None) -> mx.array:
            if length != n:
                raise DFlashError(f"tree verify: a forward of {length} rows over a tree of {n} nodes.")
            if window_size not in masks:
                masks[window_size] = attention_mask(tree, prefix, window_size, rows.seen)
            return masks[window_size]

        angles = RowAngles(positions)
        try:
            for h, row_rope in zip(self.holders, self.row_ropes):
                row_rope.angles = angles
                h.rope = row_rope
            for c in self.kv:
                c.make_mask = make_mask
            with tree_block(rows):
                yield
        finally:
            for h, row_rope in zip(self.holders, self.row_ropes):
                h.rope, row_rope.angles = row_rope.held, None
            for c in self.kv:
                c.__dict__.pop("make_mask", None)

    def forward(self, tree: DraftTree) -> mx.array:
        """The target's logits (N, V) at every node of the tree (graph only); the cache grows by N."""
        with self.inputs(tree, self.kv[0].offset):
            return self.model(mx.array(tree.tokens, dtype=mx.int32)[None], cache=self.cache)[0]

    def compact(self, prefix: int, path: list[int]) -> None:
        """Keep the K/V rows of `path` (nodes from the root, as slots after `prefix`) at consecutive slots
        from `prefix`, and drop the rest of the tree's rows; give each GatedDeltaNet layer the state after
        `path` (evaluated here: the round's rollback time)."""
        keep = mx.array([prefix + node for node in path], dtype=mx.int32)
        end = prefix + len(path)
        in_place = path == list(range(len(path)))  # a prefix of the flat order is already in place
        for c in self.kv:
            if not in_place:
                c.keys[..., prefix:end, :] = mx.take(c.keys, keep, axis=2)
                c.values[..., prefix:end, :] = mx.take(c.values, keep, axis=2)
            c.offset = end
        if self.states:
            mx.eval(commit_path(self.states, path))
