"""kernels/cpu_exp.py and kernels/cpu_swiglu.py against float64 and mlx-lm's swiglu, and its installation in a CPU target."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

from engine.decode.generate import generate
from engine.decode.events import SummaryEvent
from engine.decode.settings import GenerationSettings
from engine.models.kernel_dispatch import DISABLE_ENV
from engine.models.pair import load_pair
from kernels import cpu_exp
from kernels import cpu_swiglu as ck


def test_exp_is_within_two_ulp_of_float64_and_zero_where_expf_is():
    rng = np.random.default_rng(0)
    halves = (np.arange(-125, 127) + 0.5) * np.log(2)  # where the range reduction's rounding turns
    x = np.concatenate([rng.uniform(-87.3, 88.0, 200_000), rng.normal(0, 1, 50_000), [0.0, 1e-30, -1e-30, 88.0],
                        halves, np.nextafter(halves, 0), np.nextafter(halves, np.inf)])
    x = x[(x > -87.3) & (x < 88.0)].astype(np.float32)
    got = np.array(cpu_exp.exp(mx.array(x))).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 2 * 2.0**-23
    below = np.array(cpu_exp.exp(mx.array([-87.4, -100.0, -np.inf], dtype=mx.float32)))
    assert below.tolist() == [0.0, 0.0, 0.0]
    above = np.array(cpu_exp.exp(mx.array([88.5, 1000.0, np.inf], dtype=mx.float32)))
    assert np.isfinite(above).all() and (above == above[0]).all() and above[0] > 1e38
    with pytest.raises(ValueError, match="float32"):  # its rounding is float32's
        cpu_exp.exp(mx.array([1.0], dtype=mx.float16))


def test_swiglu_matches_mlx_lm():
    rng = np.random.default_rng(2)
    gate = mx.array(np.concatenate([rng.normal(0, 4, (1, 16, 90)), [[[-200.0, -90, -20, 20, 90, 200]] * 16]],
                                   axis=-1).astype(np.float32))
    x = mx.array(rng.normal(0, 1, (1, 16, 96)).astype(np.float32))
    np.testing.assert_allclose(np.array(ck.swiglu(gate, x)), np.array(mlx_lm_swiglu(gate, x)), atol=1e-6, rtol=1e-5)


def test_swiglu_gradients_are_mlx_lm_ones():
    """A target trained through the model file (the recipes) differentiates the kernel."""
    rng = np.random.default_rng(4)
    gate = mx.array(rng.normal(0, 3, (1, 8, 32)).astype(np.float32))
    x = mx.array(rng.normal(0, 1, (1, 8, 32)).astype(np.float32))
    weights = mx.array(rng.normal(0, 1, (1, 8, 32)).astype(np.float32))
    grads = [mx.grad(lambda g, u: (f(g, u) * weights).sum(), argnums=(0, 1))(gate, x) for f in (ck.swiglu, mlx_lm_swiglu)]
    for mine, theirs in zip(*grads):
        np.testing.assert_allclose(np.array(mine), np.array(theirs), atol=1e-5, rtol=1e-5)


def test_one_token_steps_and_half_precision_stay_with_mlx_lm():
    swiglu = ck.swiglu_with_fallback(lambda g, x: "stock")
    assert swiglu(mx.zeros((1, 1, 8)), mx.zeros((1, 1, 8))) == "stock"  # a one-token step: AR unchanged
    half = mx.zeros((1, 4, 8), dtype=mx.float16)
    assert swiglu(half, half) == "stock"
    assert isinstance(swiglu(mx.zeros((1, 4, 8)), mx.zeros((1, 4, 8))), mx.array)


def _dflash_and_ar(pair, prompt: str, max_tokens: int = 48) -> tuple[list[int], list[int]]:
    ids = pair.tokenizer.encode(prompt)
    out = []
    for mode in ("dflash", "ar"):
        summary = [e for e in generate(pair, ids, GenerationSettings(mode=mode, max_tokens=max_tokens))
                   if isinstance(e, SummaryEvent)][-1]
        out.append(summary.token_ids)
    return out[0], out[1]


def test_a_cpu_target_gets_the_kernels_and_stays_lossless(qwen3_tied_dirs, monkeypatch):
    import mlx_lm.models.qwen3 as qwen3

    pair = load_pair(*qwen3_tied_dirs)
    assert pair.facts()["cpu_kernels"] and "mlx_lm.models.qwen3.swiglu" in pair.cpu_kernels
    assert "mlx_lm.models.qwen3.scaled_dot_product_attention" in pair.cpu_kernels
    assert qwen3.swiglu.stock is not None  # the model file's functions dispatch now
    assert qwen3.scaled_dot_product_attention.stock is not None
    with_kernels = _dflash_and_ar(pair, "import json\n\nclass Decoder:\n")
    assert with_kernels[0] == with_kernels[1]  # DFlash (verifies through the kernels) == AR

    monkeypatch.setenv(DISABLE_ENV, "1")
    plain = load_pair(*qwen3_tied_dirs)
    assert plain.cpu_kernels == () and not hasattr(qwen3.swiglu, "stock")
    assert not hasattr(qwen3.scaled_dot_product_attention, "stock")
    without = _dflash_and_ar(plain, "import json\n\nclass Decoder:\n")
    assert without == with_kernels  # the same text either way on this prompt
    monkeypatch.delenv(DISABLE_ENV)
    assert load_pair(*qwen3_tied_dirs).cpu_kernels  # and back for the other tests
