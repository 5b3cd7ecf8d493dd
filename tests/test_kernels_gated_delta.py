"""Gated delta with tape, tape replay and re-run: every available implementation against the reference.

The reference and the GPU kernels keep a strict contract: a multi-step call is
bit-identical to the same steps taken one at a time, and replaying (or re-running) the
first n steps from the tape restores, bit for bit, the state the forward passed
through after n steps. The CPU's chunked pass (closed form, for verifies and
prefills) keeps it to rounding only, as a dense target's verify matmuls do: greedy
DFlash then equals greedy AR except at floating-point near-ties, which parity locates
and measures.
"""

import mlx.core as mx
import pytest
from mlx_lm.models.gated_delta import compute_g, gated_delta_ops

import engine  # noqa: F401  (optimised BLAS before MLX work)
from kernels import gated_delta_rerun, gated_delta_tape, gpu_backend, select, tape_replay
from kernels.gated_delta import tape_implementation

HAS_METAL = mx.metal.is_available()
HAS_CUDA = mx.cuda.is_available()
needs_metal = pytest.mark.skipif(not HAS_METAL, reason="Metal is not available on this machine (MLX runs on the CPU)")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="MLX is not running on CUDA on this machine")


def inputs(seed=0, B=1, T=12, Hk=2, Hv=4, Dk=16, Dv=16, dtype=mx.float32, vector_gate=False):
    """Random inputs shaped and scaled as a GatedDeltaNet layer makes them (k l2-normalised)."""
    mx.random.seed(seed)
    q = mx.random.normal((B, T, Hk, Dk)) * Dk**-1.0
    k = mx.random.normal((B, T, Hk, Dk))
    k = k / mx.sqrt((k * k).sum(-1, keepdims=True))
    v = mx.random.normal((B, T, Hv, Dv))
    per_head = (Hv, Dk) if vector_gate else (Hv,)
    a = mx.random.normal((B, T) + per_head)
    g = compute_g(mx.log(mx.random.uniform(1.0, 16.0, per_head)), a, mx.ones(per_head))
    beta = mx.sigmoid(mx.random.normal((B, T, Hv)))
    state = mx.random.normal((B, Hv, Dv, Dk)) * 0.1
    cast = lambda x: x.astype(dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), g, cast(beta), state


def equal(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and mx.array_equal(a, b).item()


# ---- the reference, on the CPU ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("vector_gate", [False, True])
def test_reference_equals_mlx_lm_recurrence(dtype, vector_gate):
    """Op for op mlx-lm's gated_delta_ops: bit-identical outputs and state."""
    q, k, v, g, beta, state = inputs(dtype=dtype, vector_gate=vector_gate)
    y_ref, s_ref = gated_delta_ops(q, k, v, g, beta, state)
    y, s, delta = gated_delta_tape(q, k, v, g, beta, state, impl="reference")
    assert equal(y, y_ref) and equal(s, s_ref)
    assert delta.dtype == mx.float32 and delta.shape == v.shape


def _single_steps(impl, q, k, v, g, beta, state):
    ys = []
    for t in range(q.shape[1]):
        y, state, _ = gated_delta_tape(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[:, t : t + 1],
                                       beta[:, t : t + 1], state, impl=impl)
        ys.append(y)
    return mx.concatenate(ys, axis=1), state


def check_steps_and_replay(impl, dtype=mx.float32, **shape):
    """Multi-step == single steps; replay and re-run of n steps == the forward's state after n steps."""
    q, k, v, g, beta, state = inputs(dtype=dtype, **shape)
    y, final, delta = gated_delta_tape(q, k, v, g, beta, state, impl=impl)
    y1, final1 = _single_steps(impl, q, k, v, g, beta, state)
    assert equal(y, y1) and equal(final, final1)
    T = q.shape[1]
    for n in range(1, T + 1):
        _, after_n, _ = gated_delta_tape(q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n], state, impl=impl)
        replayed = tape_replay(state, k[:, :n], g[:, :n], delta[:, :n], impl=impl)
        rerun = gated_delta_rerun(state, k[:, :n], v[:, :n], g[:, :n], beta[:, :n], impl=impl)
        assert equal(replayed, after_n), n
        assert equal(rerun, after_n), n
    return y, final, delta


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_reference_steps_and_replay_are_exact(dtype):
    check_steps_and_replay("reference", dtype)
    check_steps_and_replay("reference", dtype, B=2, Hk=1, Hv=3, Dk=32, Dv=8)


def test_dispatch_uses_the_reference_on_the_cpu_and_for_shapes_kernels_do_not_take():
    q, k, v, g, beta, state = inputs(Dk=16)
    assert select(k, g, state) == "reference"  # Dk 16: below the kernels' 32-lane layout, on any device
    q, k, v, g, beta, state = inputs(Dk=64)
    expected = gpu_backend() or "reference"
    assert select(k, g, state) == expected
    with pytest.raises(ValueError, match="implementation"):
        select(k, g, state, impl="vulkan")


# ---- the chunked pass, on the CPU ----------------------------------------------------------------------


def close(a, b, atol=1e-5) -> bool:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return a.shape == b.shape and mx.allclose(a, b, atol=atol, rtol=atol).item()


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("shape", [dict(T=2), dict(T=16, Dk=64, Dv=32), dict(B=2, T=150, Hk=1, Hv=3, Dk=32, Dv=8)])
def test_chunked_pass_is_the_recurrence_to_rounding(dtype, shape):
    """Short verifies, a full block, and a prefill longer than one chunk (150 > 64 tokens)."""
    q, k, v, g, beta, state = inputs(dtype=dtype, **shape)
    with mx.stream(mx.cpu):
        y, final, delta = gated_delta_tape(q, k, v, g, beta, state, impl="chunked")
        y_ref, final_ref, delta_ref = gated_delta_tape(q, k, v, g, beta, state, impl="reference")
        assert y.dtype == q.dtype and final.dtype == delta.dtype == mx.float32
        assert close(y, y_ref, atol=GPU_ATOL[dtype]) and close(final, final_ref) and close(delta, delta_ref)
        # its tape rolls back as the reference's does: replay and re-run of n steps land where n steps lead
        T = q.shape[1]
        for n in sorted({1, 2, T // 2, T}):
            after_n = gated_delta_tape(q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n], state, impl="reference")[1]
            assert close(tape_replay(state, k[:, :n], g[:, :n], delta[:, :n]), after_n, atol=1e-4), n
        assert not mx.array_equal(delta, delta_ref).item()  # a different computation, not the reference again


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("shape", [dict(T=16, B=1, Hk=2, Hv=4, Dk=32, Dv=32), dict(T=150, B=2, Hk=1, Hv=3)])
def test_chunked_pass_compiled_gives_the_bits_of_its_ops_run_one_by_one(dtype, shape):
    """It is compiled (a verify's few tokens cost mostly per-op overhead); fusing must not round
    differently, or a verify would stop matching what the uncompiled pass was tested to give.
    A verify's block, and a batched prefill of several chunks."""
    q, k, v, g, beta, state = inputs(dtype=dtype, **shape)
    with mx.stream(mx.cpu):
        fused = gated_delta_tape(q, k, v, g, beta, state, impl="chunked")
        mx.disable_compile()
        try:
            plain = gated_delta_tape(q, k, v, g, beta, state, impl="chunked")
            mx.eval(plain)
        finally:
            mx.enable_compile()
    assert all(mx.array_equal(a, b).item() for a, b in zip(fused, plain))


def test_chunked_pass_survives_a_gate_of_zero():
    """A gate of 0 forgets the state; the decay ratios must stay finite (no inf - inf)."""
    q, k, v, g, beta, state = inputs(T=8)
    g = mx.where(mx.arange(8)[None, :, None] == 3, 0.0, g)
    with mx.stream(mx.cpu):
        got = gated_delta_tape(q, k, v, g, beta, state, impl="chunked")
        want = gated_delta_tape(q, k, v, g, beta, state, impl="reference")
    assert all(mx.isfinite(x).all().item() for x in got)
    assert all(close(a, b) for a, b in zip(got, want))


def test_chunked_pass_has_finite_gradients_at_a_gate_of_zero():
    """exp(A) * softplus(a + dt_bias) above ~87 makes a gate exactly 0 in fp32; one NaN gradient
    would ruin a training run (clip_grad_norm does not stop NaN)."""
    q, k, v, g, beta, state = inputs(T=8)
    g = mx.where(mx.arange(8)[None, :, None] == 3, 0.0, g)

    def loss(g, v, impl):
        y, final, _ = gated_delta_tape(q, k, v, g, beta, state, impl=impl)
        return (y * y).sum() + (final * final).sum()

    with mx.stream(mx.cpu):
        got = mx.grad(loss, argnums=(0, 1))(g, v, "chunked")
        want = mx.grad(loss, argnums=(0, 1))(g, v, "reference")
    assert all(mx.isfinite(x).all().item() for x in got)
    assert close(got[1], want[1], atol=1e-4)


@pytest.mark.skipif(mx.default_device() != mx.cpu, reason="the chunked pass is the CPU's default")
def test_on_the_cpu_several_tokens_take_the_chunked_pass_and_single_steps_the_reference():
    q, k, v, g, beta, state = inputs(T=16)
    assert tape_implementation(k, g, state) == "chunked"
    assert equal(gated_delta_tape(q, k, v, g, beta, state)[2], gated_delta_tape(q, k, v, g, beta, state, impl="chunked")[2])
    assert tape_implementation(k[:, :1], g[:, :1], state) == "reference"  # AR steps: mlx-lm's arithmetic
    one = [x[:, :1] for x in (q, k, v, g, beta)]
    assert equal(gated_delta_tape(*one, state)[1], gated_delta_ops(*one, state)[1])
    q, k, v, g, beta, state = inputs(T=16, vector_gate=True)
    assert tape_implementation(k, g, state) == "reference"  # one gate per key channel: stepwise only
    assert tape_implementation(k, g, state, impl="reference") == "reference"


# ---- GPU kernels --------------------------------------------------------------------------------------
# Against the reference they agree to a tolerance, not bitwise: the kernels sum each
# reduction (S k, S q) as 32 per-lane partials combined by a SIMD/warp tree and use fused
# multiply-adds, where the reference sums with MLX's CPU reduction and rounds each product.
# Within one kernel family, steps, replay and re-run must be bit-exact (checked above).

GPU_ATOL = {mx.float32: 1e-4, mx.bfloat16: 2e-2}  # bf16: y is rounded to 8 bits of mantissa


def check_against_reference(impl, dtype):
    shape = dict(B=2, T=16, Hk=2, Hv=4, Dk=64, Dv=32)
    q, k, v, g, beta, state = inputs(dtype=dtype, **shape)
    y, final, delta = check_steps_and_replay(impl, dtype, **shape)
    with mx.stream(mx.cpu):
        y_ref, final_ref, delta_ref = gated_delta_tape(q, k, v, g, beta, state, impl="reference")
        mx.eval(y_ref, final_ref, delta_ref)
    atol = GPU_ATOL[dtype]
    assert mx.allclose(y.astype(mx.float32), y_ref.astype(mx.float32), atol=atol, rtol=atol).item()
    assert mx.allclose(final, final_ref, atol=1e-4, rtol=1e-4).item()
    assert mx.allclose(delta, delta_ref, atol=1e-4, rtol=1e-4).item()


@needs_metal
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_metal_kernels(dtype):
    with mx.stream(mx.gpu):
        assert gpu_backend() == "metal"
        check_against_reference("metal", dtype)


@needs_cuda
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_cuda_kernels(dtype):
    with mx.stream(mx.gpu):
        assert gpu_backend() == "cuda"
        check_against_reference("cuda", dtype)


# ---- the runtime self-check that guards the default choice of a GPU kernel ----------------------

@pytest.fixture
def pretend_metal(monkeypatch):
    """Dispatch as if MLX ran on Metal; the 'kernel' is whatever the test puts in gated_delta_metal."""
    import kernels.gated_delta as gd
    import kernels.gated_delta_metal as metal

    monkeypatch.setattr(gd, "gpu_backend", lambda: "metal")
    monkeypatch.setattr(gd, "_self_checks", {})
    monkeypatch.setattr(metal, "gated_delta_tape_metal",
                        lambda q, k, v, g, b, s: gated_delta_tape(q, k, v, g, b, s, impl="reference"))
    monkeypatch.setattr(metal, "tape_replay_metal", lambda s, k, g, d: tape_replay(s, k, g, d, impl="reference"))
    return gd, metal


def test_a_kernel_that_agrees_with_the_reference_is_chosen(pretend_metal):
    gd, _ = pretend_metal
    q, k, v, g, beta, state = inputs(Dk=64)
    assert gd.select(k, g, state) == "metal"
    assert "self-check against the reference passed" in gd.kernel_status()


@pytest.mark.parametrize("fault, message", [
    ("raises", "RuntimeError: no Metal device"),
    ("wrong state", "state differs from the reference"),
    ("replay drifts", "tape replay does not reproduce"),
])
def test_a_kernel_that_fails_its_self_check_falls_back_to_the_reference(pretend_metal, monkeypatch, fault, message):
    gd, metal = pretend_metal
    if fault == "raises":
        def broken(*args):
            raise RuntimeError("no Metal device")
        monkeypatch.setattr(metal, "gated_delta_tape_metal", broken)
    elif fault == "wrong state":
        def broken(q, k, v, g, b, s):
            y, final, delta = gated_delta_tape(q, k, v, g, b, s, impl="reference")
            return y, final + 1e-2, delta
        monkeypatch.setattr(metal, "gated_delta_tape_metal", broken)
    else:
        monkeypatch.setattr(metal, "tape_replay_metal",
                            lambda s, k, g, d: tape_replay(s, k, g, d, impl="reference") * (1 + 1e-6))
    q, k, v, g, beta, state = inputs(Dk=64)
    assert gd.select(k, g, state) == "reference"
    assert message in gd.kernel_status() and gd.kernel_status().startswith("reference")
