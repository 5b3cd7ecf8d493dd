"""The gated delta rule over T steps in closed form, chunk by chunk: for CPU verifies and prefills.

The reference steps through T tokens one at a time (a few small kernels per step),
so on the CPU a 16-token verify costs about sixteen single steps. Unrolled, the
innovations of a chunk solve one unit lower-triangular system per head:

    G_t    = g_1 ... g_t                                   (cumulative decay)
    delta_t = beta_t (v_t - G_t S_0 k_t - sum_{i<t} (G_t / G_i) (k_t . k_i) delta_i)
    y_t    = G_t S_0 q_t + sum_{i<=t} (G_t / G_i) (q_t . k_i) delta_i

    S_T    = G_T S_0 + sum_i (G_T / G_i) delta_i k_i^T

a handful of batched matmuls and one triangular solve, whatever T. All of it rounds
differently from single steps: the innovations (the tape), y, and the final state, which
tape replay of the whole chunk reproduces to rounding, not bit for bit as it does the
reference's. Parity against AR treats that as any other floating-point difference (the
verify's matmuls round differently from AR's too). One gate per head only (g: [B, T, Hv]).
"""

from __future__ import annotations

import math
from typing import Optional

import mlx.core as mx

from kernels.gated_delta_ref import _per_value_head

CHUNK = 64  # the triangular system is CHUNK x CHUNK per head
GATE_FLOOR = math.exp(-80.0)  # a gate of 0 decays by ~1e-35, so ratios of decays (and gradients) stay finite


@mx.custom_function
def unit_lower_solve(system: mx.array, rhs: mx.array) -> mx.array:
    """system^-1 rhs for lower-triangular systems, differentiable in both (MLX has no VJP for the
    matrix of its triangular solve), so the chunked pass also trains hybrid models on the CPU."""
    return mx.linalg.solve_triangular(system, rhs, upper=False, stream=mx.cpu)


@unit_lower_solve.vjp
def _unit_lower_solve_vjp(primals, cotangent, output):
    system, _ = primals
    d_rhs = mx.linalg.solve_triangular(mx.swapaxes(system, -1, -2), cotangent, upper=True, stream=mx.cpu)
    return -mx.tril(d_rhs @ mx.swapaxes(output, -1, -2)), d_rhs


def _chunk(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array,
    seen: Optional[mx.array] = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """(y [B, Hv, T, Dv], delta [B, Hv, T, Dv], final state [B, Hv, Dv, Dk]), all fp32, for one
    chunk; inputs head-major fp32. With `seen` ([T, T] booleans, [t, i]: i is t or an ancestor of t
    in a draft tree) each row's sums run over its root-to-node path instead of the rows before it
    (the final state is then meaningless)."""
    T = k.shape[2]
    log_g = mx.log(mx.maximum(g, GATE_FLOOR))  # floor before log: finite gradients at g = 0
    if seen is None:
        log_decay, lower = mx.cumsum(log_g, axis=-1), mx.tril(mx.ones((T, T), dtype=mx.bool_))  # [B, H, T]
    else:
        log_decay, lower = log_g @ mx.swapaxes(seen, 0, 1).astype(mx.float32), seen
    diff = log_decay[..., :, None] - log_decay[..., None, :]
    ratio = mx.exp(mx.where(lower, diff, -mx.inf))  # G_t / G_i for i <= t, else 0
    decay = mx.exp(log_decay)[..., None]
    kt = mx.swapaxes(k, -1, -2)
    s_t = mx.swapaxes(state, -1, -2)  # [B, H, Dk, Dv]
    strict = ratio * (lower & ~mx.eye(T, dtype=mx.bool_))
    system = mx.eye(T) + beta[..., None] * strict * (k @ kt)
    rhs = beta[..., None] * (v - decay * (k @ s_t))
    delta = unit_lower_solve(system, rhs)
    y = decay * (q @ s_t) + (ratio * (q @ kt)) @ delta
    to_end = ratio[..., -1, :, None]  # G_T / G_i
    state = decay[..., -1:, :] * state + mx.swapaxes(to_end * delta, -1, -2) @ k
    return y, delta, state


def gated_delta_tape_chunked(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
) -> tuple[mx.array, mx.array, mx.array]:
    """As gated_delta_tape_ref: (y in q's dtype, final state, delta fp32); g: [B, T, Hv]. The
    dispatcher (gated_delta_tape) supplies the zero state when there is none."""
    ys, deltas = [], []
    for start in range(0, q.shape[1], CHUNK):
        part = slice(start, start + CHUNK)
        y, state, delta = _token_major_chunk(q[:, part], k[:, part], v[:, part], g[:, part], beta[:, part], state)
        ys.append(y)
        deltas.append(delta)
    join = (lambda xs: mx.concatenate(xs, axis=1)) if len(ys) > 1 else (lambda xs: xs[0])
    return join(ys), state, join(deltas)


def token_major(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array,
    seen: Optional[mx.array] = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """One chunk from and to the token-major layout ([B, T, H, ...]): (y, final state, delta)."""
    Hv = v.shape[-2]
    q, k = _per_value_head(q, Hv), _per_value_head(k, Hv)

    def heads(x: mx.array) -> mx.array:  # [B, T, H, ...] -> [B, H, T, ...] fp32
        return mx.moveaxis(x.astype(mx.float32), 1, 2)

    y, delta, state = _chunk(heads(q), heads(k), heads(v), heads(g), heads(beta), state, seen)
    return mx.moveaxis(y, 2, 1).astype(q.dtype), state, mx.moveaxis(delta, 2, 1)


# Compiled (once per chunk length): a verify's few tokens cost mostly per-op overhead on the CPU, which
# fusing the elementwise ops cuts, with the same bits (tests/test_kernels_gated_delta.py compares it
# with compile disabled; the saving: docs/performance.md).
_token_major_chunk = mx.compile(lambda q, k, v, g, beta, state: token_major(q, k, v, g, beta, state))
