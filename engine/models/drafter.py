"""The DFlash drafter: a few Qwen3-style layers that draft a whole block in one pass.

Queries come from the block only; keys/values are the cached context (projected
from target taps) followed by the block itself. Only context K/V are cached
(RoPE'd at their true positions); block K/V are recomputed every round, so a
rejected draft needs no drafter rollback.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from engine.models.drafter_config import SLIDING, DrafterConfig


class ContextCache:
    """Context K/V of one drafter layer: every position, or a sink (the first `sink` positions
    seen) plus a window (the last `window`). A sliding layer keeps its trained window - 1;
    a full-attention layer keeps what the run's --draft-window / --draft-sink say (all by default).

    Keys stay RoPE'd at their true positions, so a block query sees a sink key at its real
    distance. Unbounded layers grow through mlx-lm's KVCache (buffers grow in steps, so a round
    does not copy the whole history); bounded ones are small, so concatenating is cheap there.
    """

    def __init__(self, window: Optional[int] = None, sink: int = 0):
        self.window = window
        self.sink = sink if window is not None else 0
        self._growing = KVCache() if window is None else None
        self.keys: Optional[mx.array] = None
        self.values: Optional[mx.array] = None
        self._sink: Optional[tuple[mx.array, mx.array]] = None  # the sink's keys and values
        self._recent: Optional[tuple[mx.array, mx.array]] = None  # the window's
        self.offset = 0  # absolute position of the next context entry
        self.start = 0  # absolute position of the window's first key (keys after the sink's)

    def append(self, keys: mx.array, values: mx.array) -> None:
        first = self.offset
        self.offset += keys.shape[2]
        if self._growing is not None:
            self.keys, self.values = self._growing.update_and_fetch(keys, values)
            return
        if first < self.sink:  # the sink fills first, once
            take = self.sink - first
            head = (keys[:, :, :take], values[:, :, :take])
            self._sink = head if self._sink is None else tuple(
                mx.concatenate([a, b], axis=2) for a, b in zip(self._sink, head))
        if self._recent is not None:
            keys = mx.concatenate([self._recent[0], keys], axis=2)
            values = mx.concatenate([self._recent[1], values], axis=2)
        self._recent = (keys[:, :, -self.window :], values[:, :, -self.window :])
        self.start = self.offset - self._recent[0].shape[2]
        if self._sink is not None and self.start > 0:  # the sink and the window no longer overlap
            sink_keep = min(self.sink, self.start)
            self.keys = mx.concatenate([self._sink[0][:, :, :sink_keep], self._recent[0]], axis=2)
            self.values = mx.concatenate([self._sink[1][:, :, :sink_keep], self._recent[1]], axis=2)
        else:
            self.keys, self.values = self._recent

    def positions(self) -> mx.array:
        """Absolute positions of the kept keys, in the order of `keys`."""
        kept = 0 if self.keys is None else self.keys.shape[2]
        window = mx.arange(self.start, self.offset)
        sink = kept - window.shape[0]
        return mx.concatenate([mx.arange(sink), window]) if sink > 0 else window

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None else [self.keys, self.values]


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig, sliding: bool, causal: bool):
        super().__init__()
        dim, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.scale = hd**-0.5
        self.window = cfg.sliding_window if sliding else None
        self.causal = causal
        self.q_proj = nn.Linear(dim, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, dim, bias=False)
        self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(
            hd,
            base=cfg.rope_theta,
            traditional=False,
            scaling_config=cfg.rope_scaling,
            max_position_embeddings=cfg.max_position_embeddings,
        )

    def context_kv(self, x: mx.array, offset) -> tuple[mx.array, mx.array]:
        """RoPE'd keys and values of x (B, L, H) at positions offset.. (int, or (B,) array)."""
        B, L, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        return self.rope(k, offset=offset), v

    def _mask(self, L: int, cache: ContextCache, offset: int) -> Optional[mx.array]:
        if self.window is None and not self.causal:
            return None
        return block_mask(L, cache.positions(), offset, self.window, self.causal)

    def attend(self, x: mx.array, offset, ctx_k, ctx_v, mask: Optional[mx.array]) -> mx.array:
        """Block queries over [context ; block] keys; offset is the anchor position (int or (B,))."""
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        q = self.rope(q, offset=offset)
        k, v = self.context_kv(x, offset)
        if ctx_k is not None:
            k = mx.concatenate([ctx_k, k], axis=2)
            v = mx.concatenate([ctx_v, v], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def __call__(self, x: mx.array, ctx: Optional[mx.array], cache: ContextCache, offset: int):
        if ctx is not None and ctx.shape[1] > 0:
            cache.append(*self.context_kv(ctx, cache.offset))
        mask = self._mask(x.shape[1], cache, offset)
        return self.attend(x, offset, cache.keys, cache.values, mask)


def block_mask(L: int, ctx_pos: mx.array, anchor_pos, window: Optional[int], causal: bool) -> mx.array:
    """Which keys each block query sees: (L, C + L), or (N, 1, L, C + L) for (N,) anchor positions.

    ctx_pos: absolute positions of the C context keys (for training, all sequence positions:
    those at or after the anchor are hidden). A sliding layer sees context with
    query_pos - key_pos < window; inside the block, causal layers see positions <= their own.
    """
    block = mx.arange(L)
    anchor = mx.array(anchor_pos).reshape(-1, 1, 1)  # (N, 1, 1)
    q_pos = anchor + block[None, :, None]  # (N, L, 1)
    ctx_ok = ctx_pos[None, None, :] < anchor  # (N, 1, C): only what precedes the anchor
    if window is not None:
        ctx_ok = ctx_ok & ((q_pos - ctx_pos[None, None, :]) < window)
    else:
        ctx_ok = mx.broadcast_to(ctx_ok, (ctx_ok.shape[0], L, ctx_pos.shape[0]))
    inner = mx.ones((L, L), mx.bool_)
    if causal:
        inner = block[None, :] <= block[:, None]
    if window is not None:
        inner = inner & ((block[:, None] - block[None, :]) < window)
    inner = mx.broadcast_to(inner[None], (ctx_ok.shape[0], L, L))
    mask = mx.concatenate([ctx_ok, inner], axis=-1)
    return mask[0] if isinstance(anchor_pos, int) else mask[:, None]


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, sliding: bool, causal: bool):
        super().__init__()
        self.self_attn = Attention(cfg, sliding, causal)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x, ctx, cache, offset):
        # input_layernorm applies to the block stream only, never to the shared context.
        h = x + self.self_attn(self.input_layernorm(x), ctx, cache, offset)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_blocks(self, x, ctx_k, ctx_v, offsets, mask):
        """Many independent blocks at once (training): x (N, L, H), offsets (N,)."""
        h = x + self.self_attn.attend(self.input_layernorm(x), offsets, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [
            DecoderLayer(cfg, sliding=t == SLIDING, causal=_is_causal(cfg, t))
            for t in cfg.layer_types
        ]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def make_cache(self, window: Optional[int] = None, sink: int = 0) -> list[ContextCache]:
        """One context cache a layer: sliding layers keep their trained window - 1 positions;
        full-attention layers `window` (None: all) plus a `sink` of the first positions."""
        return [
            ContextCache(self.cfg.sliding_window - 1) if t == SLIDING else ContextCache(window, sink)
            for t in self.cfg.layer_types
        ]

    def __call__(
        self,
        block_embeddings: mx.array,
        context_taps: Optional[mx.array],
        cache: list[ContextCache],
        offset: int,
    ) -> mx.array:
        """Hidden states (after the final norm) for every block position.

        block_embeddings: (B, L, H), the target's embedding of [anchor, mask...].
        context_taps: (B, C, n_taps * H) for context positions not yet cached.
        offset: absolute position of the anchor (= context positions seen so far).
        """
        ctx = None
        if context_taps is not None and context_taps.shape[1] > 0:
            ctx = self.hidden_norm(self.fc(context_taps))
        h = block_embeddings
        for layer, c in zip(self.layers, cache):
            h = layer(h, ctx, c, offset)
        return self.norm(h)


    def forward_blocks(self, block_embeddings: mx.array, context_taps: mx.array, anchors: mx.array) -> mx.array:
        """Training forward: A blocks per sequence against that sequence's context.

        block_embeddings: (B, A, L, H); context_taps: (B, S, n_taps * H) for positions 0..S-1;
        anchors: (B, A) anchor positions. Block j sees only context before its anchor.
        """
        B, A, L, H = block_embeddings.shape
        S = context_taps.shape[1]
        ctx = self.hidden_norm(self.fc(context_taps))
        flat_anchors = anchors.reshape(-1)
        h = block_embeddings.reshape(B * A, L, H)
        ctx_pos = mx.arange(S)
        for layer in self.layers:
            attn = layer.self_attn
            k, v = attn.context_kv(ctx, 0)  # (B, kv, S, hd), RoPE at true positions
            k = mx.repeat(k, A, axis=0)
            v = mx.repeat(v, A, axis=0)
            mask = block_mask(L, ctx_pos, flat_anchors, attn.window, attn.causal)
            h = layer.forward_blocks(h, k, v, flat_anchors, mask)
        return self.norm(h).reshape(B, A, L, H)

    def embed(self, head, ids: mx.array) -> mx.array:
        """The block's embeddings: the target's table (DFlash2 may scale them)."""
        return head.embed(ids)

    def logits(self, head, hidden: mx.array) -> mx.array:
        """The drafter's logits: the target's head on its hidden states."""
        return head.logits(hidden)

def _is_causal(cfg: DrafterConfig, layer_type: str) -> bool:
    if cfg.is_causal is not None:
        return cfg.is_causal
    return layer_type == SLIDING
