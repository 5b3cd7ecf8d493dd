"""SwiGLU for MLX on the CPU, with an exp that vectorises.

MLX's CPU exp is slow (docs/performance.md, "A SwiGLU with a fast exp"), and
the MLP's sigmoid is a large part of what a 16-token verify costs beyond a one-token step
(16 x intermediate sigmoids a layer). The sigmoid's exp is kernels/cpu_exp.py's, compiled
shapeless with the rest into fused kernels.

The reference is mlx-lm's own swiglu (tests/test_cpu_kernels.py compares). Only float32
blocks of several tokens take this path; a one-token step (AR decoding) keeps mlx-lm's,
so AR decoding is exactly what it was. engine/models/kernel_dispatch.py installs it.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import mlx.core as mx

from kernels.cpu_exp import exp_parts

_exp_parts_of_negative = mx.compile(lambda x: exp_parts(-x), shapeless=True)


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
