"""Pure-MLX reference of the gated delta rule with a tape, and of tape replay.

One recurrent step, per value head (state S is [Dv, Dk], fp32):

    S'    = g_t * S                       (decay)
    delta = (v_t - S' k_t) * beta_t       (the innovation, fp32)
    S_t   = S' + k_t (x) delta            (update)
    y_t   = S_t q_t

This is op for op the arithmetic of mlx-lm's `_gated_delta_step_ops` (bit-identical
on the CPU). The forward and the re-run share one compiled update; the replay
needs no reductions, so its n steps are fused into a single elementwise pass that
performs the same roundings in the same order. Replayed and re-run states equal
the state the forward passed through, bit for bit (tests/test_kernels_gated_delta.py).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import mlx.core as mx


def _decay(state: mx.array, g: mx.array) -> mx.array:
    """g: [B, H] (one gate per head) or [B, H, Dk] (per key channel)."""
    return state * (g[..., None, None] if g.ndim == 2 else g[..., None, :])


@mx.compile
def _decay_innovation(
    state: mx.array, g: mx.array, k: mx.array, v: mx.array, beta: mx.array
) -> tuple[mx.array, mx.array]:
    decayed = _decay(state, g)
    kv_mem = (decayed * k[..., None, :]).sum(axis=-1)
    return decayed, (v - kv_mem) * beta[..., None]


def _update_ops(decayed: mx.array, k: mx.array, delta: mx.array) -> mx.array:
    return decayed + k[..., None, :] * delta[..., None]


_update = mx.compile(_update_ops)


@mx.compile
def _readout(state: mx.array, q: mx.array) -> mx.array:
    return (state * q[..., None, :]).sum(axis=-1)


def _per_value_head(x: mx.array, hv: int) -> mx.array:
    """[B, T, Hk, D] -> [B, T, Hv, D]: each key head serves Hv // Hk value heads."""
    factor = hv // x.shape[-2]
    return mx.repeat(x, factor, -2) if factor > 1 else x


def gated_delta_tape_ref(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: Optional[mx.array] = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """(y [B, T, Hv, Dv] in q's dtype, final state, delta [B, T, Hv, Dv] in the state's dtype, fp32).

    q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv]; g: [B, T, Hv] or [B, T, Hv, Dk];
    beta: [B, T, Hv]; state: [B, Hv, Dv, Dk] (zeros when None).
    """
    B, T, _, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if state is None:
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    q, k = _per_value_head(q, Hv), _per_value_head(k, Hv)
    ys, deltas = [], []
    for t in range(T):
        decayed, delta = _decay_innovation(state, g[:, t], k[:, t], v[:, t], beta[:, t])
        state = _update(decayed, k[:, t], delta)
        ys.append(_readout(state, q[:, t]).astype(q.dtype))
        deltas.append(delta)  # fp32: the state is fp32, so (v - S'k) * beta promotes to it
    return mx.stack(ys, axis=1), state, mx.stack(deltas, axis=1)


@lru_cache(maxsize=None)
def _replay_steps(n: int):
    """n taped steps as one compiled elementwise chain: a single pass over the state.

    Each step performs the forward's two roundings (the decay, then the update).
    MLX's compiled kernels emit one statement per operation (and Metal is compiled
    without fast math), so fusing the chain changes no rounding; the tests check
    the replayed state against the forward's bit for bit.
    """

    def replay(state, k, g, delta):  # the steps' slices are taken inside: outside, 3n graph nodes a layer
        k = _per_value_head(k, delta.shape[-2])
        for t in range(n):
            state = _update_ops(_decay(state, g[:, t]), k[:, t], delta[:, t])
        return state

    return mx.compile(replay)


def tape_replay_ref(state: mx.array, k: mx.array, g: mx.array, delta: mx.array) -> mx.array:
    """The state after replaying T taped steps from `state`: no q, v or beta needed.

    k: [B, T, Hk, Dk] (as the forward saw it); g: [B, T, Hv(, Dk)]; delta: [B, T, Hv, Dv].
    """
    return _replay_steps(k.shape[1])(state, k, g, delta)


def gated_delta_rerun_ref(state: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array) -> mx.array:
    """The state after re-running the full recurrence over T steps (no readout)."""
    k = _per_value_head(k, v.shape[-2])
    for t in range(k.shape[1]):
        decayed, delta = _decay_innovation(state, g[:, t], k[:, t], v[:, t], beta[:, t])
        state = _update(decayed, k[:, t], delta)
    return state
