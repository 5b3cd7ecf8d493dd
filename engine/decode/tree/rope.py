"""RoPE with a position per query row, for a draft tree's verify (node i at the prefix plus its depth).

The general way (`RowRoPE`'s fallback): the rows go to the batch axis and the layer's own rope
rotates each at its position (MLX's rope takes one offset per batch entry).

On the CPU MLX has no rope kernel: `mx.fast.rope` is a graph of about thirty ops per call (the
angles from the positions, their cosines and sines, then the rotation), and a verify calls it twice
in every layer over the same positions. For a plain `nn.RoPE` there (a partial one too),
`RowAngles` makes the cosines and sines once per verify, by rotating a basis vector with that rope
at the rows' positions (so they are its own values, bit for bit), and each call does only the
rotation: the rope's arithmetic on the same values, so the same bits. A one-time check per rope,
dtype and head width (`rotation_is_exact`) holds the two equal on this MLX before the short way is
taken.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from engine.errors import DFlashError

# (dims, base, scale, dtype): whether the short rotation equals nn.RoPE's bit for bit here
_EXACT: dict[tuple, bool] = {}


def _rotate(x: mx.array, cos: mx.array, sin: mx.array, swap: mx.array) -> mx.array:
    """x rotated as MLX's non-traditional rope rotates it: the rotated part's halves (a, b) become
    (a cos - b sin, a sin + b cos), here x * (cos, cos) + (b, a) * (-sin, sin), the same bits in four
    ops; a partial rope's other features pass as they are. cos, sin: `_angles`, broadcast to the
    rotated part's shape; swap: its halves exchanged (`_swap`)."""
    dims = cos.shape[-1]
    if dims == x.shape[-1]:
        return x * cos + mx.take(x, swap, axis=-1) * sin
    part = x[..., :dims]
    return mx.concatenate([part * cos + mx.take(part, swap, axis=-1) * sin, x[..., dims:]], axis=-1)


def _swap(dims: int) -> mx.array:
    half = dims // 2
    return mx.concatenate([mx.arange(half, dims), mx.arange(half)]).astype(mx.int32)


def _angles(rope: nn.RoPE, positions: mx.array, dtype) -> tuple[mx.array, mx.array]:
    """((cos, cos), (-sin, sin)) (1, 1, N, dims) of `rope` at each of the N positions, as the rope
    itself makes them: its rotation of (1, ..., 1, 0, ..., 0) is (cos, sin)."""
    half = rope.dims // 2
    basis = mx.concatenate([mx.ones((half,), dtype=dtype), mx.zeros((half,), dtype=dtype)])
    turned = rope(mx.broadcast_to(basis, (positions.shape[0], 1, 1, rope.dims)), offset=positions)
    cos, sin = (t.reshape(1, 1, positions.shape[0], half) for t in (turned[..., :half], turned[..., half:]))
    return mx.concatenate([cos, cos], axis=-1), mx.concatenate([-sin, sin], axis=-1)


def _short_way(rope: nn.Module, x: mx.array) -> bool:
    """Whether the short rotation may stand in for `rope` on x: a plain, non-traditional nn.RoPE over
    an even number of x's features, on the CPU (a GPU has a rope kernel)."""
    return (type(rope) is nn.RoPE and not rope.traditional and x.ndim == 4 and rope.dims % 2 == 0
            and rope.dims <= x.shape[-1] and mx.default_device() == mx.cpu)


def rotation_is_exact(rope: nn.RoPE, dtype, width: int) -> bool:
    """Whether `_rotate` with `_angles` gives nn.RoPE's output bit for bit for this rope, dtype and
    head width on the CPU (checked once, on random rows at positions far apart)."""
    key = (rope.dims, float(rope.base), float(rope.scale), dtype, width)
    if key not in _EXACT:
        positions = mx.array([0, 1, 7, 100, 1000, 4095, 32768, 131071], dtype=mx.int32)
        shape = (1, 3, positions.shape[0], width)
        x = (mx.random.normal(shape, key=mx.random.key(0)) * 4).astype(dtype)
        cos, sin = (mx.broadcast_to(t, (*shape[:-1], rope.dims)) for t in _angles(rope, positions, dtype))
        stock = rope(x.swapaxes(0, -2), offset=positions).swapaxes(0, -2)
        _EXACT[key] = bool(mx.array_equal(_rotate(x, cos, sin, _swap(rope.dims)), stock).item())
    return _EXACT[key]


class RowAngles:
    """One verify's row positions and, per rope, head count and dtype, the cosines and sines a plain
    rope rotates them by (made at the first layer that asks, shared by the rest)."""

    def __init__(self, positions: mx.array):
        self.positions = positions
        self._tables: dict[tuple, Optional[tuple[mx.array, mx.array, mx.array]]] = {}

    def table(self, rope: nn.Module, x: mx.array) -> Optional[tuple[mx.array, mx.array, mx.array]]:
        """`_rotate`'s (cos, sin, swap) for x, or None where the short rotation does not stand in for
        the rope (`_short_way`, `rotation_is_exact`)."""
        if not _short_way(rope, x):
            return None
        key = (rope.dims, rope.base, rope.scale, x.shape, x.dtype)
        if key not in self._tables:
            table = None
            if rotation_is_exact(rope, x.dtype, x.shape[-1]):
                shape = (*x.shape[:-1], rope.dims)
                cos, sin = (mx.broadcast_to(t, shape) for t in _angles(rope, self.positions, x.dtype))
                table = (cos, sin, _swap(rope.dims))
            self._tables[key] = table
        return self._tables[key]


class RowRoPE(nn.Module):
    """A layer's RoPE with its own position per query row. Made once per run for each layer; a verify
    sets `angles` (its rows' positions) while it runs."""

    def __init__(self, rope: nn.Module):
        super().__init__()
        self.rope = rope
        self.angles: Optional[RowAngles] = None

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        positions = self.angles.positions
        if x.shape[0] != 1 or x.shape[-2] != positions.shape[0]:
            raise DFlashError(f"tree verify: a batch of one over {positions.shape[0]} nodes was expected, "
                              f"got attention input {tuple(x.shape)}.")
        table = self.angles.table(self.rope, x)
        if table is None:
            return self.rope(x.swapaxes(0, -2), offset=positions).swapaxes(0, -2)
        return _rotate(x, *table)
