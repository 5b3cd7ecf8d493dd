"""Gated delta with tape, tape replay and re-run: one entry point each, dispatched by device.

`impl` picks an implementation explicitly ("reference", "chunked", "metal", "cuda");
by default the GPU kernel of the running backend is used where its shape
requirements hold (Dk a multiple of 32, one gate per head, fp32 state, as
mlx-lm's own kernel). On the CPU, a pass over several tokens (a verify, a prefill)
with one gate per head runs the closed-form chunked pass (gated_delta_chunked.py),
single steps and everything else the pure-MLX reference.

Before a GPU kernel is first chosen by default, it runs a small problem against the
reference (`kernel_self_check`); a kernel that fails to build, disagrees with the
reference, or whose replay does not reproduce its own state exactly is not used in
this process, and the reference runs instead. Explicit `impl=` skips the check.
"""

from __future__ import annotations

import logging
from typing import Optional

import mlx.core as mx

from kernels.gated_delta_chunked import gated_delta_tape_chunked
from kernels.gated_delta_ref import gated_delta_rerun_ref, gated_delta_tape_ref, tape_replay_ref

IMPLEMENTATIONS = ("reference", "chunked", "metal", "cuda")
SELF_CHECK_ATOL = 1e-4  # fp32; the kernels reduce in another order than the reference (see the tests)

log = logging.getLogger(__name__)
_self_checks: dict[str, Optional[str]] = {}  # backend -> None (passed) or why it failed


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


def _chunked_fits(k: mx.array, g: mx.array) -> bool:
    """Several tokens, one gate per head, on the CPU (its triangular solve runs on the CPU only)."""
    return k.shape[1] > 1 and g.ndim == 3 and mx.default_device() == mx.cpu


def tape_implementation(k: mx.array, g: mx.array, state: mx.array, impl: Optional[str] = None) -> str:
    """The implementation gated_delta_tape runs for these inputs: select's, or on the CPU the
    chunked pass for several tokens with one gate per head."""
    which = select(k, g, state, impl)
    return "chunked" if which == "reference" and impl is None and _chunked_fits(k, g) else which


def select(k: mx.array, g: mx.array, state: mx.array, impl: Optional[str] = None) -> str:
    """The implementation a call with these inputs runs on."""
    if impl is not None:
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"unknown gated-delta implementation '{impl}'; expected one of {IMPLEMENTATIONS}.")
        return impl
    backend = gpu_backend()
    if backend is None or not _kernel_fits(k, g, state) or kernel_self_check(backend) is not None:
        return "reference"
    return backend


def kernel_self_check(backend: str) -> Optional[str]:
    """None when `backend`'s kernels agree with the reference on a small problem; else why not.

    Runs once per backend and process. Compares the tape pass (y, state, innovations)
    with the reference, and requires replay to reproduce the kernel's own state bit for
    bit, which is what lossless rollback rests on.
    """
    if backend not in _self_checks:
        try:
            _self_checks[backend] = _run_self_check(backend)
        except Exception as exc:  # a kernel that does not compile or launch
            _self_checks[backend] = f"{type(exc).__name__}: {exc}"
        if _self_checks[backend] is not None:
            log.warning("the %s gated-delta kernels failed their self-check (%s); using the reference",
                        backend, _self_checks[backend])
    return _self_checks[backend]


def kernel_status() -> str:
    """Which gated-delta implementation runs here, for doctor."""
    backend = gpu_backend()
    if backend is None:
        return "chunked closed form for verifies and prefills, reference for single steps (pure MLX; no GPU backend)"
    problem = kernel_self_check(backend)
    if problem is None:
        return f"{backend} kernels (self-check against the reference passed)"
    return f"reference ({backend} kernels failed their self-check: {problem})"


def _run_self_check(backend: str) -> Optional[str]:
    B, T, Hk, Hv, Dk, Dv = 1, 6, 1, 2, 32, 32
    key = mx.random.key(0)
    kq, kk, kv, kg, kb, ks = mx.random.split(key, 6)
    q = mx.random.normal((B, T, Hk, Dk), key=kq) / Dk
    k = mx.random.normal((B, T, Hk, Dk), key=kk)
    k = k / mx.sqrt((k * k).sum(-1, keepdims=True))
    v = mx.random.normal((B, T, Hv, Dv), key=kv)
    g = mx.random.uniform(0.5, 1.0, (B, T, Hv), key=kg)
    beta = mx.sigmoid(mx.random.normal((B, T, Hv), key=kb))
    state = mx.random.normal((B, Hv, Dv, Dk), key=ks) * 0.1
    with mx.stream(mx.default_device()):  # the GPU whenever a kernel is chosen by default
        got = gated_delta_tape(q, k, v, g, beta, state, impl=backend)
        replayed = tape_replay(state, k[:, :3], g[:, :3], got[2][:, :3], impl=backend)
        stepped = gated_delta_tape(q[:, :3], k[:, :3], v[:, :3], g[:, :3], beta[:, :3], state, impl=backend)[1]
        mx.eval(got, replayed, stepped)
    with mx.stream(mx.cpu):
        want = gated_delta_tape(q, k, v, g, beta, state, impl="reference")
        mx.eval(want)
    for name, a, b in zip(("y", "state", "delta"), got, want):
        if not mx.allclose(a, b, atol=SELF_CHECK_ATOL, rtol=SELF_CHECK_ATOL).item():
            return f"{name} differs from the reference by {mx.abs(a - b).max().item():.3g}"
    if not mx.array_equal(replayed, stepped).item():
        return "tape replay does not reproduce the state of the same steps"
    return None


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
    which = tape_implementation(k, g, state, impl)
    if which == "chunked":
        return gated_delta_tape_chunked(q, k, v, g, beta, state)
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

    Bit-identical to the state a stepwise `gated_delta_tape` (the reference, a GPU kernel)
    reached after the same T steps on the same implementation; equal to rounding after
    the CPU's chunked pass, whose innovations it replays with the reference.
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
