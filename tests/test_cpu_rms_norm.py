"""kernels/cpu_rms_norm.py: blocks of several tokens are normalised by a compiled graph with MLX's own
bits (a verify's logits must be what MLX gives, or a block could differ from AR's steps); one-token
steps keep MLX's."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from engine.models.pair import load_pair
from kernels import cpu_rms_norm
from kernels.cpu_rms_norm import BlockRMSNorm, install_block_norms


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch):
    monkeypatch.setattr(cpu_rms_norm, "_EXACT", {})


def _block_norm(width: int, eps: float, dtype, seed: int) -> nn.RMSNorm:
    layer = nn.RMSNorm(width, eps=eps)
    layer.weight = mx.array(np.random.default_rng(seed).normal(size=width).astype(np.float32)).astype(dtype)
    layer.__class__ = BlockRMSNorm
    return layer


@pytest.mark.parametrize("shape,dtype", [((1, 16, 128), mx.float32), ((1, 7, 4, 32), mx.float32),
                                         ((1, 300, 64), mx.bfloat16), ((2, 5, 48), mx.float16)],
                         ids=lambda v: str(v))
def test_blocks_get_mlxs_own_bits(shape, dtype):
    """Hidden states (batch, tokens, width) and per-head query and key rows (batch, tokens, heads, width)."""
    layer = _block_norm(shape[-1], 1e-6, dtype, seed=len(shape))
    rng = np.random.default_rng(shape[-1])
    for scale in (1e-3, 1.0, 1e3):
        x = mx.array((rng.normal(size=shape) * scale).astype(np.float32)).astype(dtype)
        out = layer(x)
        assert out.dtype == mx.fast.rms_norm(x, layer.weight, 1e-6).dtype
        assert mx.array_equal(out, mx.fast.rms_norm(x, layer.weight, 1e-6)).item()
    assert cpu_rms_norm._EXACT == {(shape[-1], dtype, 1e-6): True}  # the compiled way was taken


def test_one_token_keeps_mlxs(monkeypatch):
    layer = _block_norm(32, 1e-5, mx.float32, seed=0)
    assert cpu_rms_norm.norm_is_exact(32, mx.float32, 1e-5)  # checked before `norm` is watched
    taken = []
    monkeypatch.setattr(cpu_rms_norm, "norm", lambda *a: taken.append(a) or mx.fast.rms_norm(*a))
    x = mx.random.normal((1, 1, 4, 32))  # one token's query heads: not a block
    assert mx.array_equal(layer(x), mx.fast.rms_norm(x, layer.weight, 1e-5)).item()
    assert not taken
    layer(mx.random.normal((1, 3, 32)))
    assert len(taken) == 1


def test_a_norm_off_by_a_bit_is_not_taken(monkeypatch):
    """The one-time check compares bits: a graph off in the last places fails it, and blocks take MLX's."""
    made = cpu_rms_norm.norm
    monkeypatch.setattr(cpu_rms_norm, "norm", lambda x, w, eps: made(x, w, eps) * (1 + 1e-6))
    layer = _block_norm(64, 1e-6, mx.float32, seed=1)
    x = mx.random.normal((1, 8, 64))
    assert mx.array_equal(layer(x), mx.fast.rms_norm(x, layer.weight, 1e-6)).item()
    assert cpu_rms_norm._EXACT == {(64, mx.float32, 1e-6): False}


def test_a_cpu_pair_has_its_norms_made_block_norms_and_back_without_kernels(qwen3_tied_dirs, monkeypatch):
    pair = load_pair(*qwen3_tied_dirs)
    names = {name for name, _ in pair.target.parameters().items()}
    norms = [m for m in pair.target.modules() if isinstance(m, nn.RMSNorm)]
    assert norms and all(type(m) is BlockRMSNorm for m in norms)  # the layer norms, the q and k norms, the last
    assert all(type(m) is BlockRMSNorm for m in pair.drafter.modules() if isinstance(m, nn.RMSNorm))
    assert "mlx_lm.models.qwen3.rms_norm" in pair.cpu_kernels
    assert install_block_norms(pair.target, on=True) == len(norms)  # again: nothing changes
    assert install_block_norms(pair.target, on=False) == 0
    assert all(type(m) is nn.RMSNorm for m in norms) and {n for n, _ in pair.target.parameters().items()} == names
    monkeypatch.setenv("DFLASH_NO_CPU_KERNELS", "1")
    plain = load_pair(*qwen3_tied_dirs)
    assert all(type(m) is nn.RMSNorm for m in plain.target.modules() if isinstance(m, nn.RMSNorm))
