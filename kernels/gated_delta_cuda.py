"""CUDA kernels (mx.fast.cuda_kernel): gated delta with tape, and tape replay.

The same layout and arithmetic as the Metal kernels: one warp per (batch, value
head, value row), Dk / 32 state elements per lane, a sequential loop over the
T steps, a xor-butterfly warp sum. Rounding is spelled out with intrinsics
(`__fmul_rn`, `__fmaf_rn`) because nvcc contracts `a * b + c` by default: the
forward and the replay must perform the very same operations for the replayed
state to be bit-identical. Needs Dk % 32 == 0, one gate per head, fp32 state.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

_HEADER = """
__device__ __forceinline__ float dflash_warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}
"""

_INDEXING = """
  const int T = steps[0];
  const int n = blockIdx.z;
  const int b_idx = n / Hv;
  const int hv_idx = n % Hv;
  const int hk_idx = hv_idx / (Hv / Hk);
  constexpr int n_per_t = Dk / 32;
  const int lane = threadIdx.x;
  const int dv_idx = blockIdx.y * blockDim.y + threadIdx.y;
  if (dv_idx >= Dv) {
    return;  // a whole warp: all its lanes share threadIdx.y
  }

  // k (and q): [B, T, Hk, Dk]; v, y, delta: [B, T, Hv, Dv]; g, beta: [B, T, Hv]
  auto k_ = k + (size_t(b_idx) * T * Hk + hk_idx) * Dk + n_per_t * lane;
  auto d_ = delta + (size_t(b_idx) * T * Hv + hv_idx) * Dv + dv_idx;
  auto g_ = g + size_t(b_idx) * T * Hv + hv_idx;

  // state_in, state_out: [B, Hv, Dv, Dk]
  auto i_state = state_in + (size_t(n) * Dv + dv_idx) * Dk + n_per_t * lane;
  auto o_state = state_out + (size_t(n) * Dv + dv_idx) * Dk + n_per_t * lane;

  float s[n_per_t];
  for (int i = 0; i < n_per_t; ++i) {
    s[i] = static_cast<float>(i_state[i]);
  }
"""

_FORWARD_SOURCE = (
    _INDEXING
    + """
  auto q_ = q + (size_t(b_idx) * T * Hk + hk_idx) * Dk + n_per_t * lane;
  auto v_ = v + (size_t(b_idx) * T * Hv + hv_idx) * Dv + dv_idx;
  auto y_ = y + (size_t(b_idx) * T * Hv + hv_idx) * Dv + dv_idx;
  auto beta_ = beta + size_t(b_idx) * T * Hv + hv_idx;

  for (int t = 0; t < T; ++t) {
    float gt = static_cast<float>(g_[0]);
    float kv_mem = 0.0f;
    for (int i = 0; i < n_per_t; ++i) {
      s[i] = __fmul_rn(s[i], gt);
      kv_mem = __fmaf_rn(s[i], static_cast<float>(k_[i]), kv_mem);
    }
    kv_mem = dflash_warp_sum(kv_mem);
    float dt = __fmul_rn(__fsub_rn(static_cast<float>(v_[0]), kv_mem), static_cast<float>(beta_[0]));

    float out = 0.0f;
    for (int i = 0; i < n_per_t; ++i) {
      s[i] = __fmaf_rn(static_cast<float>(k_[i]), dt, s[i]);
      out = __fmaf_rn(s[i], static_cast<float>(q_[i]), out);
    }
    out = dflash_warp_sum(out);
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
      s[i] = __fmaf_rn(static_cast<float>(k_[i]), dt, __fmul_rn(s[i], gt));
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
    return mx.fast.cuda_kernel(
        name="dflash_gated_delta_tape",
        input_names=["q", "k", "v", "g", "beta", "state_in", "steps"],
        output_names=["y", "state_out", "delta"],
        source=_FORWARD_SOURCE,
        header=_HEADER,
    )


@cache
def _replay_kernel():
    return mx.fast.cuda_kernel(
        name="dflash_gated_delta_replay",
        input_names=["k", "g", "delta", "state_in", "steps"],
        output_names=["state_out"],
        source=_REPLAY_SOURCE,
        header=_HEADER,
    )


def _template(dtype, state: mx.array, k: mx.array, hv: int, dv: int) -> list:
    _, _, hk, dk = k.shape
    return [("InT", dtype), ("StT", state.dtype), ("Dk", dk), ("Dv", dv), ("Hk", hk), ("Hv", hv)]


def _steps(t: int) -> mx.array:
    # A runtime argument, not a template constant: prefill chunks of any length reuse one build.
    return mx.array([t], dtype=mx.int32)


def gated_delta_tape_cuda(q, k, v, g, beta, state):
    B, T, _, _ = k.shape
    Hv, Dv = v.shape[-2:]
    y, state_out, delta = _forward_kernel()(
        inputs=[q, k, v, g, beta, state, _steps(T)],
        template=_template(q.dtype, state, k, Hv, Dv),
        grid=(32, Dv, B * Hv),
        threadgroup=(32, 4, 1),
        output_shapes=[(B, T, Hv, Dv), state.shape, (B, T, Hv, Dv)],
        output_dtypes=[q.dtype, state.dtype, mx.float32],
    )
    return y, state_out, delta


def tape_replay_cuda(state, k, g, delta):
    B, T, _, _ = k.shape
    Hv, Dv = delta.shape[-2:]
    (state_out,) = _replay_kernel()(
        inputs=[k, g, delta, state, _steps(T)],
        template=_template(k.dtype, state, k, Hv, Dv),
        grid=(32, Dv, B * Hv),
        threadgroup=(32, 4, 1),
        output_shapes=[state.shape],
        output_dtypes=[state.dtype],
    )
    return state_out
