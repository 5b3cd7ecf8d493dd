"""Attention for mid-sized verify blocks on the CPU, kept in MLX's graph with a fast exp.

MLX's CPU attention spends most of a verify block's time in its softmax's exp (about 9 ns an
element, kernels/cpu_exp.py). The host path (kernels/verify_attention.py) is faster per score but
evaluates q, k and v at every layer, a sync that only blocks with many scores repay. Between the
two, this computes the same attention as MLX ops that stay in the lazy graph: the scores of each
KV head's query groups in one matmul, the mask and scale in one fused kernel, exp from
kernels/cpu_exp.py, and the normalisation after the values' matmul (a row of D, not of S, is divided).
Its reference is kernels/verify_attention.py's `reference`; tests/test_verify_attention.py holds the
two equal (and to float64) with causal, sliding-window and tree masks, and tests/test_tree_verify.py
each tree node's logits to a causal pass over its path through it. Where the crossovers lie:
docs/performance.md, "Verify attention on the host".
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from kernels.cpu_exp import exp_parts

_masked_scores = mx.compile(lambda s, allowed, scale: mx.where(allowed, s * scale, -mx.inf), shapeless=True)
_scaled_scores = mx.compile(lambda s, scale: s * scale, shapeless=True)
_exp_below_max = mx.compile(lambda s, top: exp_parts(s - top), shapeless=True)


def graph_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, allowed: Optional[mx.array]) -> mx.array:
    """softmax(q k^T * scale) v over the keys `allowed` lets each row see ((L, S) booleans; None: all),
    for float32 q (B, Hq, L, D) and k, v (B, Hkv, S, D). Every row must see at least one key."""
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    scores = (q.reshape(B, Hkv, groups * L, D) @ k.swapaxes(-1, -2)).reshape(B, Hkv, groups, L, S)
    factor = mx.array(scale, dtype=mx.float32)
    scores = _scaled_scores(scores, factor) if allowed is None else _masked_scores(scores, allowed, factor)
    p, two_n = _exp_below_max(scores, scores.max(axis=-1, keepdims=True))
    weights = p * two_n.view(mx.float32)
    out = (weights.reshape(B, Hkv, groups * L, S) @ v).reshape(B, Hkv, groups, L, D)
    return (out / weights.sum(axis=-1, keepdims=True)).reshape(B, Hq, L, D)
