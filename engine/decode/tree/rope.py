"""RoPE with a position per query row, for a draft tree's verify (node i at the prefix plus its depth).

The general way (`RowRoPE`'s fallback): the rows go to the batch axis and the layer's own rope
rotates each at its position (MLX's rope takes one offset per batch entry). On the CPU, for a plain
`nn.RoPE` (a partial one too), `RowAngles` makes the cosines and sines once per verify and each layer
only rotates (kernels/cpu_rope.py: the rope's own bits, checked once per rope, dtype and head width).
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from engine.errors import DFlashError
from kernels.cpu_rope import rotate, rotates, stock_rope, table_for, table_key


class RowAngles:
    """One verify's row positions and, per rope, the tables a plain rope rotates them by (made at the
    first layer that asks, shared by the rest, queries and keys alike)."""

    def __init__(self, positions: mx.array):
        self.positions = positions
        self._tables: dict[tuple, Optional[tuple[mx.array, mx.array, mx.array]]] = {}

    def table(self, rope: nn.Module, x: mx.array) -> Optional[tuple[mx.array, mx.array, mx.array]]:
        """`rotate`'s (cos, sin, swap) for x, or None where the short rotation does not stand in for
        the rope (kernels.cpu_rope.rotates)."""
        key = table_key(rope, x) if type(rope) is nn.RoPE else None
        if key not in self._tables:
            self._tables[key] = table_for(rope, self.positions, x.dtype) if rotates(rope, x) else None
        return self._tables[key]


class RowRoPE(nn.Module):
    """A layer's RoPE with its own position per query row. Made once per run for each layer (`held`:
    the layer's own rope module, put back after each verify); a verify sets `angles` (its rows'
    positions) while it runs."""

    def __init__(self, rope: nn.Module):
        super().__init__()
        self.held = rope
        self.rope = stock_rope(rope)
        self.angles: Optional[RowAngles] = None

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        positions = self.angles.positions
        if x.shape[0] != 1 or x.shape[-2] != positions.shape[0]:
            raise DFlashError(f"tree verify: a batch of one over {positions.shape[0]} nodes was expected, "
                              f"got attention input {tuple(x.shape)}.")
        table = self.angles.table(self.rope, x)
        if table is None:
            return self.rope(x.swapaxes(0, -2), offset=positions).swapaxes(0, -2)
        return rotate(x, *table)
