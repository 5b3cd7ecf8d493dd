"""RMSNorm for blocks of rows on the CPU: MLX's own arithmetic, compiled into fewer kernels.

On the CPU MLX has no RMSNorm kernel: `mx.fast.rms_norm` runs its fallback, a graph of about seven
ops (a cast, the square, the mean, the epsilon, the reciprocal square root, two products), and a
Qwen3 forward calls it four times a layer (the two layer norms, the query and key norms). `norm`
below is that graph, compiled shapeless: its elementwise runs become fused kernels, the same
operations in the same order, so the same bits; a one-time check per width, dtype and epsilon
(`norm_is_exact`) holds the two equal on this MLX before a layer takes it. What it saves:
docs/performance.md, "RMSNorm compiled".

`BlockRMSNorm` (engine/models/kernel_dispatch.py turns a pair's plain `nn.RMSNorm` layers into it on
the CPU) takes blocks of several tokens (verifies, prefill chunks, a drafter's block); a one-token
step keeps MLX's, so AR decoding runs as it did.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn

# (width, dtype, eps): whether `norm` equals mx.fast.rms_norm bit for bit here
_EXACT: dict[tuple, bool] = {}


@partial(mx.compile, shapeless=True)
def _norm(x: mx.array, weight: mx.array, eps: mx.array) -> mx.array:
    y = x.astype(mx.float32)
    y = y * mx.rsqrt(mx.mean(mx.square(y), axis=-1, keepdims=True) + eps)
    return y.astype(x.dtype) * weight


def norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """mx.fast.rms_norm(x, weight, eps), as MLX's CPU fallback computes it."""
    return _norm(x, weight, mx.array(eps, dtype=mx.float32))


def norm_is_exact(width: int, dtype, eps: float) -> bool:
    """Whether `norm` gives mx.fast.rms_norm's output bit for bit for this width, dtype and epsilon
    (checked once, on random rows of several scales)."""
    key = (width, dtype, float(eps))
    if key not in _EXACT:
        k1, k2 = mx.random.split(mx.random.key(0))
        scales = mx.array([1e-3, 1e-1, 1.0, 10.0, 1e3])[:, None, None]
        x = (mx.random.normal((5, 4, width), key=k1) * scales).astype(dtype)
        weight = mx.random.normal((width,), key=k2).astype(dtype)
        _EXACT[key] = bool(mx.array_equal(norm(x, weight, eps), mx.fast.rms_norm(x, weight, eps)).item())
    return _EXACT[key]


class BlockRMSNorm(nn.RMSNorm):
    """nn.RMSNorm whose blocks of several tokens (x of (batch, tokens, ...) with tokens > 1) take the
    compiled `norm`; one token, and widths where it is not exact, take MLX's."""

    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        if (x.ndim >= 3 and x.shape[1] > 1 and weight.shape[-1] == x.shape[-1]
                and norm_is_exact(x.shape[-1], x.dtype, self.eps)):
            return norm(x, weight, self.eps)
        return super().__call__(x)


def install_block_norms(model: nn.Module, on: bool) -> int:
    """Make every plain nn.RMSNorm of `model` a BlockRMSNorm (on), or plain again (off), in place (its
    weight and its name in the model stay); the number made BlockRMSNorm."""
    made = 0
    for module in model.modules():
        if type(module) is nn.RMSNorm and on:
            module.__class__ = BlockRMSNorm
            made += 1
        elif type(module) is BlockRMSNorm:
            if on:
                made += 1
            else:
                module.__class__ = nn.RMSNorm
    return made
