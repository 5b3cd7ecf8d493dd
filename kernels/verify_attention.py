"""Multi-row attention for verify blocks: a pure-MLX reference, a host path for the CPU, and
(kernels/verify_attention_metal.py) a Metal kernel for Macs.

A verify asks the target about a block of L positions at once, so every attention layer
computes L x heads rows of softmax over the whole KV cache, where a one-token step computes
one per head. MLX's CPU attention spends most of that on exp and on unvectorised element
passes (max, sum, where), so at depth its cost grows with the context L times faster than a
step's.

On the CPU, `host_attention` evaluates q, k and v and computes the block's attention in NumPy,
whose exp and reductions are vectorised and whose matmuls share one BLAS call per KV head
(what it saves: docs/performance.md, "Verify attention on the host"). The rows are processed in chunks
so the score matrix stays small whatever L is. `host_attention_trainable` is the same forward
with a NumPy backward, so a recipe can train long windows through it (training is not
compiled then: NumPy needs concrete arrays).

A draft tree's verify (engine/decode/tree) passes a boolean (rows, keys) mask: each node sees the
context and its own ancestors. The host path takes it as it takes a sliding window's mask, and
tests/test_verify_attention.py holds it to the reference on random trees.

The reference is `reference` (pure MLX ops), and MLX's own `mx.fast.scaled_dot_product_attention`
is held to it too (tests/test_verify_attention.py). engine/models/kernel_dispatch.py installs the
dispatcher: float32 calls with 2..MAX_ROWS query rows (verify blocks) deep enough to repay the
host's per-layer sync (MIN_HOST_SCORES), and inside whole_sequences()
whole sequences run without a cache (the drafter trainer's target pass), take the host path on the
CPU; smaller verify blocks take kernels/cpu_attention.py's attention in MLX's graph with a fast exp
(from MIN_GRAPH_SCORES). One-token steps (AR decoding) and prefill chunks of more than MAX_ROWS
rows stay MLX's, so AR's steps are exactly what they were; a shorter prompt's prefill takes the path
a verify block of its size would.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Callable, Iterator, Optional, Union

import mlx.core as mx
import numpy as np

from kernels.cpu_attention import graph_attention

MAX_ROWS = 64  # query rows per call that the dispatcher sends here: verify blocks
CHUNK_SCORES = 1 << 22  # score elements per chunk of rows (16 MB of float32)
# Verify blocks with fewer score elements (query heads x rows x keys) than this stay in MLX's graph:
# the host path evaluates q, k and v at every layer, a fixed cost a layer that a small block's
# attention does not repay (where the crossovers lie: docs/performance.md, "Verify attention on the host").
MIN_HOST_SCORES = 1 << 14
# Smaller verify blocks from this many score elements take kernels/cpu_attention.py's in-graph
# attention, whose exp is fast; below it MLX's (fewer ops a layer, and little to exp).
MIN_GRAPH_SCORES = 1 << 12

Mask = Union[None, str, mx.array]
# Whole sequences run without a cache take the host path only inside whole_sequences(): NumPy needs
# concrete arrays, so a forward traced by mx.compile (a compiled training step) must keep MLX's.
_WHOLE_SEQUENCES: ContextVar[bool] = ContextVar("host_attention_for_whole_sequences", default=False)


@contextmanager
def whole_sequences() -> Iterator[None]:
    """Forwards without a cache (a trainer's target pass, an uncompiled training step) take the host
    path inside this block."""
    token = _WHOLE_SEQUENCES.set(True)
    try:
        yield
    finally:
        _WHOLE_SEQUENCES.reset(token)


def causal_allowed(rows: int, keys: int, xp=mx):
    """(rows, keys) booleans: the rows are the last `rows` positions; each sees keys up to its own."""
    return xp.arange(keys)[None, :] <= (keys - rows) + xp.arange(rows)[:, None]


def reference(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask) -> mx.array:
    """softmax(q k^T * scale, masked) v in plain MLX ops, float32 inside.
    q (B, Hq, L, D); k, v (B, Hkv, S, D); mask None, "causal" (aligned to the last key, as MLX's),
    or a boolean array broadcastable to (L, S)."""
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    qf = q.astype(mx.float32).reshape(B, Hkv, groups, L, D)
    scores = (qf * scale) @ k.astype(mx.float32)[:, :, None].swapaxes(-1, -2)
    if mask is not None:
        allowed = causal_allowed(L, S) if isinstance(mask, str) else mask
        scores = mx.where(allowed, scores, -mx.inf)
    weights = mx.softmax(scores, axis=-1, precise=True)
    out = weights @ v.astype(mx.float32)[:, :, None]
    return out.reshape(B, Hq, L, D).astype(q.dtype)


def _blocked_rows(mask, L: int, S: int) -> Optional[np.ndarray]:
    """(L, S) booleans: the scores a row may not see (None: it sees every key)."""
    if mask is None:
        return None
    if isinstance(mask, str):
        return _causal_blocked(L, S)
    return ~np.broadcast_to(np.asarray(mask), (L, S))


@lru_cache(maxsize=8)
def _causal_blocked(rows: int, keys: int) -> np.ndarray:
    """A causal block's blocked scores, made once per block shape (every layer of a forward asks for
    the same), read-only."""
    blocked = ~causal_allowed(rows, keys, np)
    blocked.flags.writeable = False
    return blocked


def _chunks(L: int, rows_per_query: int, S: int) -> list[slice]:
    step = max(1, CHUNK_SCORES // max(rows_per_query * S, 1))
    return [slice(i, min(i + step, L)) for i in range(0, L, step)]


def _softmax_rows(qn: np.ndarray, kn: np.ndarray, scale: float, blocked: Optional[np.ndarray]) -> np.ndarray:
    """Weights (B, Hkv, G, l, S) for query rows qn (B, Hkv, G, l, D) against keys kn (B, Hkv, S, D);
    `blocked` (l, S): the scores set to -inf, in place (a masked copy of the scores costs more)."""
    scores = (qn * np.float32(scale)) @ kn[:, :, None].swapaxes(-1, -2)
    if blocked is not None:
        np.copyto(scores, np.float32(-np.inf), where=blocked)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _host_forward(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask) -> np.ndarray:
    mx.eval(q, k, v)
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qn = np.asarray(q).reshape(B, Hkv, Hq // Hkv, L, D)
    kn, vn = np.asarray(k), np.asarray(v)
    blocked = _blocked_rows(mask, L, S)
    out = np.empty_like(qn)
    for rows in _chunks(L, Hq, S):
        weights = _softmax_rows(qn[..., rows, :], kn, scale, None if blocked is None else blocked[rows])
        out[..., rows, :] = weights @ vn[:, :, None]
    return out.reshape(B, Hq, L, D)


def host_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask) -> mx.array:
    """The reference's result, computed in NumPy (float32 inputs on the CPU)."""
    return mx.array(_host_forward(q, k, v, scale, mask))


def _host_backward(q, k, v, scale: float, mask: Mask, d_out: np.ndarray):
    """Gradients of the attention for q, k, v given d_out (B, Hq, L, D): the softmax's
    dS = P * (dP - rowsum(dO * O)), recomputing P per chunk of rows."""
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    qn = np.asarray(q).reshape(B, Hkv, groups, L, D)
    kn, vn = np.asarray(k), np.asarray(v)
    d_out = d_out.reshape(B, Hkv, groups, L, D)
    blocked = _blocked_rows(mask, L, S)
    dq = np.empty_like(qn)
    dk, dv = np.zeros_like(kn), np.zeros_like(vn)
    for rows in _chunks(L, Hq, S):
        p = _softmax_rows(qn[..., rows, :], kn, scale, None if blocked is None else blocked[rows])
        do = d_out[..., rows, :]
        out = p @ vn[:, :, None]
        dv += (p.swapaxes(-1, -2) @ do).sum(axis=2)
        dp = do @ vn[:, :, None].swapaxes(-1, -2)
        ds = p * (dp - (do * out).sum(axis=-1, keepdims=True)) * np.float32(scale)
        dq[..., rows, :] = ds @ kn[:, :, None]
        dk += (ds.swapaxes(-1, -2) @ qn[..., rows, :]).sum(axis=2)
    return dq.reshape(B, Hq, L, D), dk, dv


def host_attention_trainable(scale: float, mask: Mask) -> Callable[[mx.array, mx.array, mx.array], mx.array]:
    """host_attention(q, k, v) with a NumPy vjp, for training long windows on the CPU."""

    @mx.custom_function
    def attend(q, k, v):
        return host_attention(q, k, v, scale, mask)

    @attend.vjp
    def attend_vjp(primals, cotangent, output):
        q, k, v = primals
        mx.eval(q, k, v, cotangent)
        return tuple(mx.array(g) for g in _host_backward(q, k, v, scale, mask, np.asarray(cotangent)))

    return attend


def handles(q: mx.array, k: mx.array, mask: Mask, sinks: Optional[mx.array],
            max_rows: Optional[int] = MAX_ROWS) -> bool:
    """Calls the host path and kernels/cpu_attention.py handle: float32, 2..max_rows query rows (None:
    any, for whole sequences), query heads a multiple of the KV heads, a plain, causal or boolean
    (rows, keys) mask, no attention sinks. (A boolean mask must let every row see a key, as causal,
    sliding-window and tree masks do: a row that sees none is NaN there and in the reference.) Which
    of the two takes a verify block goes by its score elements (MIN_HOST_SCORES, MIN_GRAPH_SCORES)."""
    if q.dtype != mx.float32 or k.dtype != mx.float32 or sinks is not None or q.ndim != 4:
        return False
    if q.shape[2] < 2 or (max_rows is not None and q.shape[2] > max_rows) or q.shape[1] % k.shape[1]:
        return False
    if isinstance(mask, str):
        return mask == "causal"
    return mask is None or (mask.dtype == mx.bool_ and mask.ndim <= 2)


@lru_cache(maxsize=8)
def _causal(rows: int, keys: int) -> mx.array:
    """causal_allowed, made once per block shape (every layer of a forward asks for the same), as
    data rather than a lazy graph: MLX's streams are per thread, and an unevaluated array made on
    one thread (a forward dropped by a cancel) cannot be evaluated on another."""
    return mx.array(causal_allowed(rows, keys, np))


def sdpa_with_fallback(stock: Callable) -> Callable:
    """mlx-lm's scaled_dot_product_attention signature: for verify blocks (not over a quantized KV
    cache) the host path, or kernels/cpu_attention.py's for smaller ones; inside whole_sequences(),
    the host path for whole sequences run without a cache (training and distillation forwards,
    through the trainable path so gradients still flow); `stock` (mlx-lm's) for everything else:
    one-token steps, prefill chunks, compiled steps."""

    def sdpa_dispatch(queries, keys, values, cache, scale, mask, sinks=None):
        if cache is None and _WHOLE_SEQUENCES.get() and handles(queries, keys, mask, sinks, max_rows=None):
            return host_attention_trainable(scale, mask)(queries, keys, values)
        if cache is not None and not hasattr(cache, "bits") and handles(queries, keys, mask, sinks):
            scores = queries.shape[1] * queries.shape[2] * keys.shape[2]
            if scores >= MIN_HOST_SCORES:
                return host_attention(queries, keys, values, scale, mask)
            if scores >= MIN_GRAPH_SCORES:
                allowed = _causal(queries.shape[2], keys.shape[2]) if isinstance(mask, str) else mask
                return graph_attention(queries, keys, values, scale, allowed)
        return stock(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)

    sdpa_dispatch.stock = stock
    return sdpa_dispatch
