"""Gated delta with tape, tape replay and re-run: one entry point each, dispatched by device.

`impl` picks an implementation explicitly ("reference", "metal", "cuda"); by
default the GPU kernel of the running backend is used where its shape
requirements hold (Dk a multiple of 32, one gate per head, fp32 state, as
mlx-lm's own kernel), and the pure-MLX reference everywhere else.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from kernels.gated_delta_ref import gated_delta_rerun_ref, gated_delta_tape_ref, tape_replay_ref

IMPLEMENTATIONS = ("reference", "metal", "cuda")


def gpu_backend() -> Optional[str]:
    """'metal' or 'cuda' when the default device is a GPU of that kind, else None."""
    if mx.default_device() != mx.gpu:
        return None
    if mx.metal.is_available():
        return "metal"
    if mx.cuda.is_available():
        return "cuda"
    return None


def _kernel_fits(k: mx.array, g: mx.array, state: mx.array) -> bool:
    dk = k.shape[-1]
    return dk >= 32 and dk % 32 == 0 and g.ndim == 3 and state.dtype == mx.float32


def select(k: mx.array, g: mx.array, state: mx.array, impl: Optional[str] = None) -> str:
    """The implementation a call with these inputs runs on."""
    if impl is not None:
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"unknown gated-delta implementation '{impl}'; expected one of {IMPLEMENTATIONS}.")
        return impl
    backend = gpu_backend()
    return backend if backend is not None and _kernel_fits(k, g, state) else "reference"


def _zeros_state(q: mx.array, v: mx.array) -> mx.array:
    return mx.zeros((q.shape[0], v.shape[-2], v.shape[-1], q.shape[-1]), dtype=mx.float32)


def gated_delta_tape(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: Optional[mx.array] = None,
    impl: Optional[str] = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """(y, final state, delta): the recurrence over T steps and its per-step innovation (fp32).

    q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv]; g: [B, T, Hv] (or [B, T, Hv, Dk],
    reference only); beta: [B, T, Hv]; state: [B, Hv, Dv, Dk] fp32.
    """
    if state is None:
        state = _zeros_state(q, v)
    which = select(k, g, state, impl)
    if which == "metal":
        from kernels.gated_delta_metal import gated_delta_tape_metal

        return gated_delta_tape_metal(q, k, v, g, beta, state)
    if which == "cuda":
        from kernels.gated_delta_cuda import gated_delta_tape_cuda

        return gated_delta_tape_cuda(q, k, v, g, beta, state)
    return gated_delta_tape_ref(q, k, v, g, beta, state)


def tape_replay(
    state: mx.array, k: mx.array, g: mx.array, delta: mx.array, impl: Optional[str] = None
) -> mx.array:
    """The state after the taped steps: S_t = g_t * S_{t-1} + k_t (x) delta_t, t = 1..T.

    Bit-identical to the state `gated_delta_tape` reached after the same T steps
    on the same implementation.
    """
    which = select(k, g, state, impl)
    if which == "metal":
        from kernels.gated_delta_metal import tape_replay_metal

        return tape_replay_metal(state, k, g, delta)
    if which == "cuda":
        from kernels.gated_delta_cuda import tape_replay_cuda

        return tape_replay_cuda(state, k, g, delta)
    return tape_replay_ref(state, k, g, delta)


def gated_delta_rerun(
    state: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, impl: Optional[str] = None
) -> mx.array:
    """The state after re-running the full recurrence over T steps (the "rerun" rollback).

    On a GPU this is the forward kernel itself (k stands in for q; y is dropped),
    so it is the forward's arithmetic by construction.
    """
    which = select(k, g, state, impl)
    if which == "reference":
        return gated_delta_rerun_ref(state, k, v, g, beta)
    return gated_delta_tape(k, k, v, g, beta, state, impl=which)[1]
