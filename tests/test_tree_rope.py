"""engine/decode/tree/rope.py: a tree verify's RoPE at a position per row. On the CPU a plain rope's
short rotation (cosines made once per verify) must give the rope's own output bit for bit, since a
tree's logits must be the chain's and AR's; ropes it does not cover take the general way."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.rope_utils import Llama3RoPE

from engine.decode.tree.rope import RowAngles, RowRoPE
from engine.errors import DFlashError
from kernels import cpu_rope

from helpers import ROPE_CASES, attention_rows


def _per_row(rope, x, positions):
    """Each row through the rope alone at its own offset: what the tree's rows must get."""
    return mx.concatenate([rope(x[:, :, i : i + 1], offset=int(p)) for i, p in enumerate(positions)], axis=2)


pytestmark = pytest.mark.usefixtures("fresh_rope_checks")


@pytest.mark.parametrize("dims,width,base,dtype", ROPE_CASES, ids=lambda v: str(v))
def test_the_short_rotation_gives_the_ropes_own_bits(dims, width, base, dtype):
    """Full and partial ropes (8 of 32 features: the hybrid demo target's)."""
    rng = np.random.default_rng(dims + width)
    rope = nn.RoPE(dims, base=base)
    positions = (rng.integers(0, 3000) + np.sort(rng.integers(0, 12, size=17))).astype(np.int32)
    angles = RowAngles(mx.array(positions))
    row_rope = RowRoPE(rope)
    row_rope.angles = angles
    for heads in (8, 2, 8):  # queries and keys (8 and 2 heads) share one table, reused by the next layer
        x = attention_rows(rng, heads, len(positions), width, dtype)
        out = row_rope(x)
        assert angles.table(rope, x) is not None  # the short way was taken
        assert out.dtype == dtype and mx.array_equal(out, _per_row(rope, x, positions)).item()
    assert len(angles._tables) == 1  # one table for every layer's queries and keys


@pytest.mark.parametrize("rope", [nn.RoPE(32, traditional=True),
                                  Llama3RoPE(32, max_position_embeddings=2048, base=5e5,
                                             scaling_config={"factor": 8.0, "original_max_position_embeddings": 512})],
                         ids=["traditional", "llama3"])
def test_other_ropes_take_the_general_way(rope):
    rng = np.random.default_rng(1)
    positions = np.array([40, 41, 41, 42, 41, 43], dtype=np.int32)
    row_rope = RowRoPE(rope)
    row_rope.angles = RowAngles(mx.array(positions))
    x = attention_rows(rng, 4, len(positions), 32, mx.float32)
    assert row_rope.angles.table(rope, x) is None
    np.testing.assert_allclose(np.array(row_rope(x)), np.array(_per_row(rope, x, positions)), atol=1e-5)


def test_a_rotation_off_by_a_bit_is_not_taken(monkeypatch):
    """The one-time check compares bits, not closeness: cosines off in the last places fail it and
    the rows take the general way (still the rope's output)."""
    made = cpu_rope.angles
    monkeypatch.setattr(cpu_rope, "angles", lambda *a: tuple(t * (1 + 1e-6) for t in made(*a)))
    rope = nn.RoPE(32)
    assert not cpu_rope.rotation_is_exact(rope, mx.float32, 32)
    positions = np.arange(100, 108, dtype=np.int32)
    row_rope = RowRoPE(rope)
    row_rope.angles = RowAngles(mx.array(positions))
    x = attention_rows(np.random.default_rng(2), 2, len(positions), 32, mx.float32)
    assert row_rope.angles.table(rope, x) is None
    assert mx.array_equal(row_rope(x), _per_row(rope, x, positions)).item()


def test_rows_that_are_not_the_trees_are_refused_clearly():
    row_rope = RowRoPE(nn.RoPE(32))
    row_rope.angles = RowAngles(mx.arange(5))
    with pytest.raises(DFlashError, match=r"a batch of one over 5 nodes was expected, got attention input \(1, 2, 4, 32\)"):
        row_rope(mx.zeros((1, 2, 4, 32)))
