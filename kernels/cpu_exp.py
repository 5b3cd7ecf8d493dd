"""exp for float32 arrays on the CPU, in MLX elementwise ops that compile into one vectorised kernel.

MLX's CPU exp costs about 9 ns an element and is about 60 ulp from float64 (docs/performance.md,
"A SwiGLU with a fast exp"). This is Cephes' expf: range reduction by ln 2 (n rounded to nearest by
adding and taking away 1.5 * 2**23, which vectorises where floor does not), a degree-6 polynomial,
and 2**n built in a float32's exponent bits. It is within 1.3 ulp of float64 from exp's 0 (below
float32's smallest normal, as expf) to 1.6e38, where it stays. The SwiGLU (kernels/cpu_swiglu.py)
and the verify attention kept in MLX's graph (kernels/cpu_attention.py) use it; tests/test_cpu_kernels.py
holds it to float64.
"""

from __future__ import annotations

import mlx.core as mx

LOG2E = 1.4426950408889634
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 split so that n * LN2_HI is exact
ROUND = 12582912.0  # 1.5 * 2**23: x + ROUND - ROUND is x rounded to the nearest integer (|x| < 2**22)
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# below EXP_MIN exp is 0, as expf's; above EXP_MAX it stays exp(EXP_MAX) ~ 1.6e38, where 2**n
# (n <= 127) still fits a float32's exponent
EXP_MIN, EXP_MAX = -87.33654, 88.02


def exp_parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """exp(x) = p * 2**n as (p, the float32 bits of 2**n), for float32 x only (ROUND rounds at
    float32's precision); p is 0 where exp(x) is below expf's range. The bits become a float
    outside the compiled functions: a view has no shapeless form."""
    c = mx.minimum(mx.maximum(x, EXP_MIN), EXP_MAX)
    n = (c * LOG2E + ROUND) - ROUND
    r = c - n * LN2_HI - n * LN2_LO
    p = EXP_POLY[0]
    for coefficient in EXP_POLY[1:]:
        p = p * r + coefficient
    p = p * r * r + r + 1.0
    return mx.where(x < EXP_MIN, 0.0, p), mx.left_shift(n.astype(mx.int32) + 127, 23)


_exp_parts_of = mx.compile(exp_parts, shapeless=True)


def exp(x: mx.array) -> mx.array:
    """exp of a float32 array."""
    if x.dtype != mx.float32:
        raise ValueError(f"kernels.cpu_exp.exp takes float32 arrays, not {x.dtype}")
    p, two_n = _exp_parts_of(x)
    return p * two_n.view(mx.float32)
