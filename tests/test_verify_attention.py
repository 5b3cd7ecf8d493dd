"""kernels/verify_attention.py: the host path and MLX's own attention against the pure-MLX reference,
its gradients, and which calls the dispatcher sends where."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels import verify_attention as va
from kernels.cpu_attention import graph_attention

SHAPES = [  # (Hq, Hkv, L, S, D)
    (4, 2, 16, 1416, 32),  # the demo target's verify at depth
    (4, 4, 2, 3, 16),  # a block longer than the context before it
    (8, 2, 5, 40, 64),
    (6, 3, 64, 80, 32),
]


def _qkv(Hq, Hkv, L, S, D, seed=0):
    rng = np.random.default_rng(seed)
    return (mx.array(rng.normal(0, 1, (1, Hq, L, D)).astype(np.float32)),
            mx.array(rng.normal(0, 1, (1, Hkv, S, D)).astype(np.float32)),
            mx.array(rng.normal(0, 1, (1, Hkv, S, D)).astype(np.float32)))


def _float64_attention(q, k, v, scale, allowed):
    q, k, v = (np.array(a).astype(np.float64) for a in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    s = q @ k.swapaxes(-1, -2) * scale
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", [None, "causal", "window"])
def test_host_path_and_mlx_equal_the_reference_and_float64(shape, mask):
    Hq, Hkv, L, S, D = shape
    q, k, v = _qkv(*shape)
    scale = D**-0.5
    if mask == "window":  # a sliding window's boolean mask, as mlx-lm builds one
        mask = va.causal_allowed(L, S) & (mx.arange(S)[None] > (S - L) + mx.arange(L)[:, None] - 7)
    allowed = None if mask is None else np.array(va.causal_allowed(L, S) if isinstance(mask, str) else mask)
    want = va.reference(q, k, v, scale, mask)
    np.testing.assert_allclose(np.array(want), _float64_attention(q, k, v, scale, allowed), atol=2e-6, rtol=1e-5)
    for got in (va.host_attention(q, k, v, scale, mask),
                graph_attention(q, k, v, scale, None if allowed is None else mx.array(allowed)),
                mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)):
        np.testing.assert_allclose(np.array(got), np.array(want), atol=2e-6, rtol=1e-5)


def test_rows_processed_in_chunks_give_the_result_of_one_pass(monkeypatch):
    """Chunks bound the score matrix of long calls; BLAS rounds each chunk's matmul its own way."""
    q, k, v = _qkv(4, 2, 12, 30, 16, seed=3)
    whole = np.array(va.host_attention(q, k, v, 0.25, "causal"))
    monkeypatch.setattr(va, "CHUNK_SCORES", 4 * 30 * 5)  # five rows a chunk: chunks of 5, 5 and 2
    assert len(va._chunks(12, 4, 30)) == 3
    np.testing.assert_allclose(np.array(va.host_attention(q, k, v, 0.25, "causal")), whole, atol=1e-6, rtol=1e-5)


def test_gradients_equal_the_references(monkeypatch):
    """Training long windows goes through the NumPy backward: it must be attention's gradient."""
    monkeypatch.setattr(va, "CHUNK_SCORES", 4 * 24 * 5)  # several chunks of rows
    q, k, v = _qkv(4, 2, 24, 24, 16, seed=5)
    weights = mx.array(np.random.default_rng(6).normal(0, 1, (1, 4, 24, 16)).astype(np.float32))
    attend = va.host_attention_trainable(0.25, "causal")

    def loss(f):
        return lambda a, b, c: (f(a, b, c) * weights).sum()

    mine = mx.grad(loss(attend), argnums=(0, 1, 2))(q, k, v)
    theirs = mx.grad(loss(lambda a, b, c: va.reference(a, b, c, 0.25, "causal")), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(mine, theirs):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5, rtol=1e-4)


def test_the_dispatcher_sends_only_float32_verify_blocks_to_the_host():
    sdpa = va.sdpa_with_fallback(lambda *a, **kw: "stock")
    q, k, v = _qkv(4, 2, 16, 300, 16)
    plain = object()
    assert isinstance(sdpa(q, k, v, plain, 0.25, "causal"), mx.array)  # a verify block deep in a context
    assert va.MIN_HOST_SCORES > 4 * 2 * 300 and 4 * 16 * 300 >= va.MIN_HOST_SCORES
    assert sdpa(q[:, :, :2], k, v, plain, 0.25, "causal") == "stock"  # too small for the host or the graph kernel
    assert sdpa(q[:, :, :1], k, v, plain, 0.25, None) == "stock"  # a one-token step: AR unchanged
    prefill = mx.zeros((1, 4, va.MAX_ROWS + 1, 16))
    assert sdpa(prefill, k, v, plain, 0.25, "causal") == "stock"
    class Quantized:
        bits = 4

    for rows in (16, 8):  # the host path's range, and the in-graph path's (4 x 8 x 300 scores)
        a = q[:, :, :rows]
        assert isinstance(sdpa(a, k, v, plain, 0.25, "causal"), mx.array)
        assert sdpa(*(x.astype(mx.float16) for x in (a, k, v)), plain, 0.25, "causal") == "stock"
        assert sdpa(a, k, v, plain, 0.25, "causal", sinks=mx.zeros((4,))) == "stock"
        assert sdpa(a, k, v, Quantized(), 0.25, "causal") == "stock"
        assert sdpa(a, k, v, plain, 0.25, mx.zeros((rows, 300))) == "stock"  # an additive float mask


def test_blocks_between_the_thresholds_take_the_graph_kernel_and_give_the_reference(monkeypatch):
    """A verify block too small to repay the host's sync but with enough scores to exp: the in-graph
    kernel, its causal mask made by the dispatcher, not the host path."""
    sdpa = va.sdpa_with_fallback(lambda *a, **kw: "stock")
    q, k, v = _qkv(4, 2, 8, 200, 16, seed=9)
    assert va.MIN_GRAPH_SCORES <= 4 * 8 * 200 < va.MIN_HOST_SCORES
    monkeypatch.setattr(va, "_host_forward", lambda *a: pytest.fail("the host path took a block below its threshold"))
    got = sdpa(q, k, v, object(), 0.25, "causal")
    np.testing.assert_allclose(np.array(got), np.array(va.reference(q, k, v, 0.25, "causal")), atol=2e-6, rtol=1e-5)
    assert not np.allclose(np.array(got), np.array(va.reference(q, k, v, 0.25, None)), atol=1e-3)
    assert sdpa(q[:, :, :2], k, v, object(), 0.25, "causal") == "stock"  # below it: MLX's


def test_a_causal_mask_kept_from_one_thread_serves_another():
    """A forward built on one thread and dropped (a cancel) leaves its mask in the cache; the next
    run may be on another thread (the window's worker, the server's decode thread). MLX's streams are
    per thread, so a mask kept as a lazy graph could not be evaluated there."""
    import threading

    va._causal.cache_clear()
    worker = threading.Thread(target=va._causal, args=(8, 201))
    worker.start()
    worker.join()
    assert np.array(va._causal(8, 201)).tolist() == np.array(va.causal_allowed(8, 201)).tolist()


def test_the_graph_kernel_takes_batches_and_any_query_group():
    rng = np.random.default_rng(12)
    for Hq, Hkv in ((4, 4), (4, 2), (8, 2)):
        q = mx.array(rng.normal(0, 1, (2, Hq, 6, 16)).astype(np.float32))
        k, v = (mx.array(rng.normal(0, 1, (2, Hkv, 50, 16)).astype(np.float32)) for _ in range(2))
        got = graph_attention(q, k, v, 0.25, va.causal_allowed(6, 50))
        np.testing.assert_allclose(np.array(got), np.array(va.reference(q, k, v, 0.25, "causal")), atol=2e-6, rtol=1e-5)


def test_a_whole_sequence_without_a_cache_takes_the_trainable_host_path():
    """The drafter trainer's target pass (no cache, hundreds of rows) goes to the host, and a model
    trained through its file still gets attention's gradients there."""
    sdpa = va.sdpa_with_fallback(lambda *a, **kw: "stock")
    q, k, v = _qkv(4, 2, va.MAX_ROWS + 30, va.MAX_ROWS + 30, 16, seed=8)
    assert sdpa(q, k, v, None, 0.25, "causal") == "stock"  # outside the block: a compiled step may be tracing
    with va.whole_sequences():
        np.testing.assert_allclose(np.array(sdpa(q, k, v, None, 0.25, "causal")),
                                   np.array(va.reference(q, k, v, 0.25, "causal")), atol=2e-6, rtol=1e-5)
        assert sdpa(q[:, :, :1], k[:, :, :1], v[:, :, :1], None, 0.25, None) == "stock"
        grad = mx.grad(lambda a: sdpa(a, k, v, None, 0.25, "causal").sum())(q)
    want = mx.grad(lambda a: va.reference(a, k, v, 0.25, "causal").sum())(q)
    np.testing.assert_allclose(np.array(grad), np.array(want), atol=1e-5, rtol=1e-4)


def test_the_metal_path_is_used_only_for_shapes_that_pass_their_check(monkeypatch):
    """On a Mac the kernel runs only where, once per shape, it agreed with the reference and beat
    MLX; the check's logic runs here with stand-ins (no Metal on this machine)."""
    from kernels import verify_attention_metal as vm

    q, k, v = (a.astype(mx.float16) for a in _qkv(8, 2, 16, 300, 64))
    assert vm.fits(q, k, "causal", None) and not vm.fits(q.astype(mx.float32), k, "causal", None)
    assert not vm.fits(q, k, mx.zeros((16, 299), dtype=mx.bool_), None) and not vm.fits(q[..., :48], k, None, None)

    def slow_stock(*args, **kwargs):
        for _ in range(20):
            out = mx.fast.scaled_dot_product_attention(*args, **kwargs)
            mx.eval(out)
        return out

    assert vm.check_shape(q, k, v, 0.125, "causal", kernel=va.reference, stock=slow_stock) is None
    wrong = vm.check_shape(q, k, v, 0.125, "causal", kernel=lambda *a: va.reference(*a) + 1, stock=slow_stock)
    assert wrong.startswith("differs from the reference")

    def broken(*args):
        raise RuntimeError("Unable to build metal library")

    assert "Unable to build" in vm.check_shape(q, k, v, 0.125, "causal", kernel=broken)
    verdicts = iter([None, "not faster"])
    checks = vm.ShapeChecks(check=lambda *a: next(verdicts))
    monkeypatch.setattr(vm, "metal_attention", lambda *a: "kernel")
    sdpa = vm.sdpa_with_metal(lambda *a, **kw: "stock", checks)
    plain = object()
    assert sdpa(q, k, v, plain, 0.125, "causal") == "kernel"  # checked once, passed
    assert sdpa(q, k, v, plain, 0.125, "causal") == "kernel"  # the same shape: no second check
    longer = mx.zeros((1, 2, 5000, 64), dtype=mx.float16)
    assert sdpa(q, longer, longer, plain, 0.125, "causal") == "stock"  # a deeper context: its own check failed
    assert sdpa(q[:, :, :1], k, v, plain, 0.125, None) == "stock"  # AR steps stay MLX's
    assert len(checks.verdicts) == 2


def _random_tree_mask(seed: int, prefix: int, nodes: int) -> mx.array:
    """A draft tree's ancestor-only mask (engine/decode/tree) over random candidates."""
    from engine.decode.tree.layout import attention_mask, build_tree

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 100, size=(8, 3))
    logq = np.sort(np.log(rng.dirichlet(np.ones(20), size=8))[:, :3], axis=1)[:, ::-1]
    tree = build_tree(0, ids, logq, nodes - 1)
    assert len(tree) == nodes and tree.depths.max() < nodes - 1  # a real tree, not a chain
    return attention_mask(tree, prefix)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", [(4, 2, 16, 1416, 32), (8, 2, 5, 40, 64), (6, 3, 64, 80, 32)])
def test_tree_masks_give_the_reference_on_the_host_and_in_mlx(shape, seed):
    """A tree's verify: each row sees the context and its ancestors only. The host path and MLX's
    attention equal the reference and a float64 computation with the same mask."""
    Hq, Hkv, L, S, D = shape
    q, k, v = _qkv(*shape, seed=seed)
    mask = _random_tree_mask(seed, S - L, L)
    want = va.reference(q, k, v, D**-0.5, mask)
    np.testing.assert_allclose(np.array(want), _float64_attention(q, k, v, D**-0.5, np.array(mask)), atol=2e-6, rtol=1e-5)
    assert not np.allclose(np.array(want), np.array(va.reference(q, k, v, D**-0.5, "causal")), atol=1e-3)
    for got in (va.host_attention(q, k, v, D**-0.5, mask), graph_attention(q, k, v, D**-0.5, mask),
                mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)):
        np.testing.assert_allclose(np.array(got), np.array(want), atol=2e-6, rtol=1e-5)
    sdpa = va.sdpa_with_fallback(lambda *a, **kw: "stock")
    if Hq * L * S >= va.MIN_GRAPH_SCORES:  # a verify the host or the graph kernel takes: the tree's mask too
        np.testing.assert_allclose(np.array(sdpa(q, k, v, object(), D**-0.5, mask)), np.array(want), atol=2e-6, rtol=1e-5)


def test_a_tree_mask_takes_the_metal_kernel_behind_its_own_check():
    """A tree's verify may take the Metal kernel (MASKED), once its shape passed a check with its own
    mask, one check for every tree of that shape; the check's logic runs here with stand-ins (no Metal
    on this machine), and a mask of the wrong shape or dtype is MLX's."""
    from kernels import verify_attention_metal as vm

    q, k, v = (a.astype(mx.float16) for a in _qkv(8, 2, 16, 300, 64))
    mask = _random_tree_mask(0, 284, 16)
    assert vm.fits(q, k, mask, None) and not vm.fits(q, k, mask[:, :-1], None)
    assert not vm.fits(q, k, mask.astype(mx.float16), None)
    masks = []
    checks = vm.ShapeChecks(check=lambda q, k, v, scale, m: masks.append(m) or None)
    sdpa = vm.sdpa_with_metal(lambda *a, **kw: "stock", checks)
    calls = []
    import unittest.mock

    with unittest.mock.patch.object(vm, "metal_attention", lambda *a: calls.append(a[-1]) or "kernel"):
        assert sdpa(q, k, v, object(), 0.125, mask) == "kernel"
        other = _random_tree_mask(1, 284, 16)
        assert sdpa(q, k, v, object(), 0.125, other) == "kernel"
        assert sdpa(q, k, v, object(), 0.125, "causal") == "kernel"
    assert len(masks) == 2 and masks[0] is mask and masks[1] == "causal"  # the trees' shape checked once, with its mask
    assert set(checks.verdicts) == {vm.shape_key(q, k, mask), vm.shape_key(q, k, "causal")}
    assert calls[1] is other  # each call's own mask reaches the kernel
    # the check holds the kernel to the reference under the tree's mask: one that ignores it fails
    causal = lambda q, k, v, scale, m: va.reference(q, k, v, scale, "causal")  # noqa: E731
    assert vm.check_shape(q, k, v, 0.125, mask, kernel=causal).startswith("differs from the reference")
    assert np.array_equal(np.array(vm._allow(mask)), np.array(mask).astype(np.uint8))
