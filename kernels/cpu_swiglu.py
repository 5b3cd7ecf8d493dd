"""SwiGLU for MLX on the CPU, with an exp that vectorises.

MLX's CPU exp is slow (docs/performance.md, "A SwiGLU with a fast exp"), and
the MLP's sigmoid is a large part of what a 16-token verify costs beyond a one-token step
(16 x intermediate sigmoids a layer). `exp` below is Cephes' expf (range reduction by
ln 2, a degree-6 polynomial) written in MLX elementwise ops, compiled shapeless into fused
kernels: within 1.3 ulp of float64 from exp's 0 (below float32's smallest normal, as
expf) to 1.6e38, where it stays (MLX's own CPU exp: about 60 ulp).

The reference is mlx-lm's own swiglu (tests/test_cpu_kernels.py compares). Only float32
blocks of several tokens take this path; a one-token step (AR decoding) keeps mlx-lm's,
so AR decoding is exactly what it was. engine/models/kernel_dispatch.py installs it.
(A softmax built the same way did not beat MLX's fused attention at the contexts of the
demo's prompts, so attention is left to MLX.)
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import mlx.core as mx

LOG2E = 1.4426950408889634
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 split so that n * LN2_HI is exact
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# below EXP_MIN exp is 0, as expf's; above EXP_MAX it stays exp(EXP_MAX) ~ 1.6e38, where 2**n
# (n <= 127) still fits a float32's exponent
EXP_MIN, EXP_MAX = -87.33654, 88.02


def _exp_parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """exp(x) = p * 2**n as (p, the float32 bits of 2**n); p is 0 where exp(x) is below expf's range.
    The bits become a float outside the compiled functions: a view has no shapeless form."""
    c = mx.clip(x, EXP_MIN, EXP_MAX)
    n = mx.floor(c * LOG2E + 0.5)
    r = c - n * LN2_HI - n * LN2_LO
    p = EXP_POLY[0]
    for coefficient in EXP_POLY[1:]:
        p = p * r + coefficient
    p = p * r * r + r + 1.0
    return mx.where(x < EXP_MIN, 0.0, p), mx.left_shift(n.astype(mx.int32) + 127, 23)


_exp_parts_of = mx.compile(_exp_parts, shapeless=True)
_exp_parts_of_negative = mx.compile(lambda x: _exp_parts(-x), shapeless=True)


def exp(x: mx.array) -> mx.array:
    """exp of a float32 array."""
    p, two_n = _exp_parts_of(x)
    return p * two_n.view(mx.float32)


@partial(mx.compile, shapeless=True)
def _swiglu_from(gate: mx.array, x: mx.array, p: mx.array, two_n: mx.array) -> mx.array:
    return gate / (1.0 + p * two_n) * x


@mx.custom_function
def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x, as mlx-lm's swiglu (float32)."""
    p, two_n = _exp_parts_of_negative(gate)
    return _swiglu_from(gate, x, p, two_n.view(mx.float32))


@swiglu.vjp
def _swiglu_vjp(primals, cotangent, output):
    """Gradients from mlx-lm's formula: a view has no vjp, and a target being trained (the
    recipes, the hybrid tests) goes through the same model file."""
    gate, x = primals
    s = mx.sigmoid(gate)
    silu = gate * s
    return cotangent * x * (s + silu * (1 - s)), cotangent * silu


def swiglu_with_fallback(stock: Callable) -> Callable:
    """mlx-lm's swiglu signature: `swiglu` for float32 blocks of several tokens, `stock` elsewhere."""

    def swiglu_dispatch(gate, x):
        if gate.dtype == mx.float32 and x.dtype == mx.float32 and gate.ndim == 3 and gate.shape[1] > 1:
            return swiglu(gate, x)
        return stock(gate, x)

    swiglu_dispatch.stock = stock
    return swiglu_dispatch
