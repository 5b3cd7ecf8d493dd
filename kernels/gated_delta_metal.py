"""Metal kernels (mx.fast.metal_kernel): gated delta with tape, and tape replay.

Layout as mlx-lm's GatedDeltaNet kernel: one SIMD-group (32 lanes) per (batch,
value head, value row); each lane keeps Dk / 32 state elements in registers and
loops over the T steps, so a multi-step call is the same sequential arithmetic
as T one-step calls. Updates use explicit `fma`, in the forward and the replay
alike, so the replayed state is bit-identical to the forward's whatever the
compiler would otherwise contract. Needs Dk % 32 == 0, one gate per head, and
an fp32 state; the dispatcher sends everything else to the reference.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

_INDEXING = """
        auto n = thread_position_in_grid.z;
        auto b_idx = n / Hv;
        auto hv_idx = n % Hv;
        auto hk_idx = hv_idx / (Hv / Hk);
        constexpr int n_per_t = Dk / 32;
        auto lane = thread_position_in_threadgroup.x;
        auto dv_idx = thread_position_in_grid.y;

        // k (and q): [B, T, Hk, Dk]; v, y, delta: [B, T, Hv, Dv]; g, beta: [B, T, Hv]
        auto k_ = k + (b_idx * T * Hk + hk_idx) * Dk + n_per_t * lane;
        auto d_ = delta + (b_idx * T * Hv + hv_idx) * Dv + dv_idx;
        auto g_ = g + b_idx * T * Hv + hv_idx;

        // state_in, state_out: [B, Hv, Dv, Dk]
        auto i_state = state_in + (n * Dv + dv_idx) * Dk + n_per_t * lane;
        auto o_state = state_out + (n * Dv + dv_idx) * Dk + n_per_t * lane;

        float s[n_per_t];
        for (int i = 0; i < n_per_t; ++i) {
          s[i] = static_cast<float>(i_state[i]);
        }
"""

_FORWARD_SOURCE = (
    _INDEXING
    + """
        auto q_ = q + (b_idx * T * Hk + hk_idx) * Dk + n_per_t * lane;
        auto v_ = v + (b_idx * T * Hv + hv_idx) * Dv + dv_idx;
        auto y_ = y + (b_idx * T * Hv + hv_idx) * Dv + dv_idx;
        auto beta_ = beta + b_idx * T * Hv + hv_idx;

        for (int t = 0; t < T; ++t) {
          float gt = static_cast<float>(g_[0]);
          float kv_mem = 0.0f;
          for (int i = 0; i < n_per_t; ++i) {
            s[i] = s[i] * gt;
            kv_mem = metal::fma(s[i], static_cast<float>(k_[i]), kv_mem);
          }
          kv_mem = simd_sum(kv_mem);
          float dt = (static_cast<float>(v_[0]) - kv_mem) * static_cast<float>(beta_[0]);

          float out = 0.0f;
          for (int i = 0; i < n_per_t; ++i) {
            s[i] = metal::fma(static_cast<float>(k_[i]), dt, s[i]);
            out = metal::fma(s[i], static_cast<float>(q_[i]), out);
          }
          out = simd_sum(out);
          if (lane == 0) {
            y_[0] = static_cast<InT>(out);
            d_[0] = dt;
          }
          q_ += Hk * Dk;
          k_ += Hk * Dk;
          v_ += Hv * Dv;
          y_ += Hv * Dv;
          d_ += Hv * Dv;
          g_ += Hv;
          beta_ += Hv;
        }
        for (int i = 0; i < n_per_t; ++i) {
          o_state[i] = static_cast<StT>(s[i]);
        }
"""
)

_REPLAY_SOURCE = (
    _INDEXING
    + """
        for (int t = 0; t < T; ++t) {
          float gt = static_cast<float>(g_[0]);
          float dt = d_[0];
          for (int i = 0; i < n_per_t; ++i) {
            s[i] = metal::fma(static_cast<float>(k_[i]), dt, s[i] * gt);
          }
          k_ += Hk * Dk;
          d_ += Hv * Dv;
          g_ += Hv;
        }
        for (int i = 0; i < n_per_t; ++i) {
          o_state[i] = static_cast<StT>(s[i]);
        }
"""
)


@cache
def _forward_kernel():
    return mx.fast.metal_kernel(
        name="dflash_gated_delta_tape",
        input_names=["q", "k", "v", "g", "beta", "state_in", "T"],
        output_names=["y", "state_out", "delta"],
        source=_FORWARD_SOURCE,
    )


@cache
def _replay_kernel():
    return mx.fast.metal_kernel(
        name="dflash_gated_delta_replay",
        input_names=["k", "g", "delta", "state_in", "T"],
        output_names=["state_out"],
        source=_REPLAY_SOURCE,
    )


def _template(dtype, state: mx.array, k: mx.array, hv: int, dv: int) -> list:
    _, _, hk, dk = k.shape
    return [("InT", dtype), ("StT", state.dtype), ("Dk", dk), ("Dv", dv), ("Hk", hk), ("Hv", hv)]


def gated_delta_tape_metal(q, k, v, g, beta, state):
    B, T, _, _ = k.shape
    Hv, Dv = v.shape[-2:]
    y, state_out, delta = _forward_kernel()(
        inputs=[q, k, v, g, beta, state, T],
        template=_template(q.dtype, state, k, Hv, Dv),
        grid=(32, Dv, B * Hv),
        threadgroup=(32, 4, 1),
        output_shapes=[(B, T, Hv, Dv), state.shape, (B, T, Hv, Dv)],
        output_dtypes=[q.dtype, state.dtype, mx.float32],
    )
    return y, state_out, delta


def tape_replay_metal(state, k, g, delta):
    B, T, _, _ = k.shape
    Hv, Dv = delta.shape[-2:]
    (state_out,) = _replay_kernel()(
        inputs=[k, g, delta, state, T],
        template=_template(k.dtype, state, k, Hv, Dv),
        grid=(32, Dv, B * Hv),
        threadgroup=(32, 4, 1),
        output_shapes=[state.shape],
        output_dtypes=[state.dtype],
    )
    return state_out
