"""kernels/cpu_rope.py: blocks of rows rotate by angles made once per forward, with the rope's own bits
(a verify's logits must be what the rope gives, or a block could differ from AR's steps); one-token
steps, offsets per row and ropes the short way does not cover go to the rope itself."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.rope_utils import Llama3RoPE

from engine.models.pair import load_pair
from kernels import cpu_rope
from kernels.cpu_rope import BlockAngles, BlockRoPE, install_block_ropes, rope_holders

from helpers import ROPE_CASES, attention_rows


pytestmark = pytest.mark.usefixtures("fresh_rope_checks")


@pytest.mark.parametrize("dims,width,base,dtype", ROPE_CASES, ids=lambda v: str(v))
def test_blocks_get_the_ropes_own_bits_and_share_their_tables(dims, width, base, dtype):
    """Full and partial ropes (8 of 32 features: the hybrid demo target's)."""
    rng = np.random.default_rng(dims + width)
    rope, shared = nn.RoPE(dims, base=base), BlockAngles()
    layers = [BlockRoPE(rope, shared) for _ in range(3)]
    for offset, rows in ((0, 5), (37, 16), (4090, 9)):
        for layer in layers:
            for heads in (8, 2):  # queries, then keys
                x = attention_rows(rng, heads, rows, width, dtype)
                out = layer(x, offset=offset)
                assert out.dtype == dtype and mx.array_equal(out, rope(x, offset=offset)).item()
    assert len(shared._tables) == 3  # one per block, whatever the layers and head counts


def test_one_row_and_offsets_per_row_go_to_the_rope():
    rope, shared = nn.RoPE(32), BlockAngles()
    layer = BlockRoPE(rope, shared)
    x = attention_rows(np.random.default_rng(0), 4, 1, 32, mx.float32)
    assert mx.array_equal(layer(x, offset=11), rope(x, offset=11)).item()
    rows = attention_rows(np.random.default_rng(1), 4, 3, 32, mx.float32).swapaxes(0, 2)  # rows on the batch axis
    offsets = mx.array([3, 9, 4])
    assert mx.array_equal(layer(rows, offset=offsets), rope(rows, offset=offsets)).item()
    assert not shared._tables  # neither made a table


@pytest.mark.parametrize("rope", [nn.RoPE(32, traditional=True),
                                  Llama3RoPE(32, max_position_embeddings=2048, base=5e5,
                                             scaling_config={"factor": 8.0, "original_max_position_embeddings": 512})],
                         ids=["traditional", "llama3"])
def test_other_ropes_are_their_own(rope):
    layer, x = BlockRoPE(rope, BlockAngles()), attention_rows(np.random.default_rng(2), 4, 6, 32, mx.float32)
    assert mx.array_equal(layer(x, offset=40), rope(x, offset=40)).item()
    assert not layer.shared._tables


def test_a_rotation_off_by_a_bit_is_not_taken(monkeypatch):
    """The one-time check compares bits, not closeness: angles off in the last places fail it and the
    block goes to the rope itself."""
    made = cpu_rope.angles
    monkeypatch.setattr(cpu_rope, "angles", lambda *a: tuple(t * (1 + 1e-6) for t in made(*a)))
    rope = nn.RoPE(32)
    layer = BlockRoPE(rope, BlockAngles())
    x = attention_rows(np.random.default_rng(3), 2, 8, 32, mx.float32)
    assert not cpu_rope.rotation_is_exact(rope, mx.float32, 32)
    assert mx.array_equal(layer(x, offset=100), rope(x, offset=100)).item() and not layer.shared._tables


def test_a_cpu_pair_has_its_ropes_wrapped_and_back_without_kernels(qwen3_tied_dirs, monkeypatch):
    pair = load_pair(*qwen3_tied_dirs)
    ropes = [m.rope for m in rope_holders(pair.target)]
    assert len(ropes) == len(pair.target.layers) and all(isinstance(r, BlockRoPE) for r in ropes)
    assert len({id(r.shared) for r in ropes}) == 1 and "mlx_lm.models.qwen3.rope" in pair.cpu_kernels
    assert install_block_ropes(pair.target, on=True) == len(ropes)  # again: wrapped once, not twice
    assert all(type(m.rope.rope) is nn.RoPE for m in rope_holders(pair.target))
    install_block_ropes(pair.target, on=False)
    assert all(type(m.rope) is nn.RoPE for m in rope_holders(pair.target))
    drafter_ropes = [m.rope for m in rope_holders(pair.drafter)]
    assert drafter_ropes and all(isinstance(r, BlockRoPE) for r in drafter_ropes)
    monkeypatch.setenv("DFLASH_NO_CPU_KERNELS", "1")
    plain = load_pair(*qwen3_tied_dirs)
    assert all(type(m.rope) is nn.RoPE for m in rope_holders(plain.target) + rope_holders(plain.drafter))
    assert not plain.cpu_kernels
