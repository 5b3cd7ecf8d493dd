"""RoPE for blocks of rows on the CPU: the rope's own bits for a fraction of its ops.

On the CPU MLX has no rope kernel: `mx.fast.rope` runs as a graph of about thirty ops per call
(the angles from the positions, their cosines and sines, then the rotation), and a forward calls it
twice in every attention layer over the same positions. For a plain, non-traditional `nn.RoPE`,
`angles` makes the cosines and sines once per forward by rotating a basis vector with that rope at
the rows' positions (so they are its own values, bit for bit), and each call only rotates, in four
ops: the rope's arithmetic on the same values, so the same bits (a partial rope's other features
pass as they are). A one-time check per rope, dtype and head width (`rotation_is_exact`) holds the
two equal on this MLX before the short way is taken. What it saves:
docs/performance.md, "RoPE angles once per block".

`BlockRoPE` (engine/models/kernel_dispatch.py puts it in a target's attention layers on the CPU)
takes blocks of consecutive rows: verifies and prefill chunks. A one-token step keeps the rope
itself, so AR decoding runs as it did. A draft tree's verify (a position per row) rotates the
same way: engine/decode/tree/rope.py.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

# (dims, base, scale, dtype, head width): whether the short rotation equals nn.RoPE's bit for bit here
_EXACT: dict[tuple, bool] = {}


def rotate(x: mx.array, cos: mx.array, sin: mx.array, swap: mx.array) -> mx.array:
    """x rotated as MLX's non-traditional rope rotates it: the rotated part's halves (a, b) become
    (a cos - b sin, a sin + b cos), here x * (cos, cos) + (b, a) * (-sin, sin), the same bits in four
    ops; a partial rope's other features pass as they are. cos, sin: `angles`; swap: the rotated
    part's halves exchanged (`halves_swapped`)."""
    dims = cos.shape[-1]
    if dims == x.shape[-1]:
        return x * cos + mx.take(x, swap, axis=-1) * sin
    part = x[..., :dims]
    return mx.concatenate([part * cos + mx.take(part, swap, axis=-1) * sin, x[..., dims:]], axis=-1)


def halves_swapped(dims: int) -> mx.array:
    half = dims // 2
    return mx.concatenate([mx.arange(half, dims), mx.arange(half)]).astype(mx.int32)


def angles(rope: nn.RoPE, positions: mx.array, dtype) -> tuple[mx.array, mx.array]:
    """((cos, cos), (-sin, sin)) (1, 1, N, dims) of `rope` at each of the N positions, as the rope
    itself makes them: its rotation of (1, ..., 1, 0, ..., 0) is (cos, sin)."""
    half = rope.dims // 2
    basis = mx.concatenate([mx.ones((half,), dtype=dtype), mx.zeros((half,), dtype=dtype)])
    turned = rope(mx.broadcast_to(basis, (positions.shape[0], 1, 1, rope.dims)), offset=positions)
    cos, sin = (t.reshape(1, 1, positions.shape[0], half) for t in (turned[..., :half], turned[..., half:]))
    return mx.concatenate([cos, cos], axis=-1), mx.concatenate([-sin, sin], axis=-1)


def rotation_is_exact(rope: nn.RoPE, dtype, width: int) -> bool:
    """Whether `rotate` with `angles` gives nn.RoPE's output bit for bit for this rope, dtype and head
    width on the CPU (checked once, on random rows at positions far apart)."""
    key = (*rope_key(rope), dtype, width)
    if key not in _EXACT:
        positions = mx.array([0, 1, 7, 100, 1000, 4095, 32768, 131071], dtype=mx.int32)
        shape = (1, 3, positions.shape[0], width)
        x = (mx.random.normal(shape, key=mx.random.key(0)) * 4).astype(dtype)
        stock = rope(x.swapaxes(0, -2), offset=positions).swapaxes(0, -2)
        _EXACT[key] = bool(mx.array_equal(rotate(x, *table_for(rope, positions, dtype)), stock).item())
    return _EXACT[key]


def rotates(rope: nn.Module, x: mx.array) -> bool:
    """Whether `rope`'s rotation of x (batch, heads, rows, width) may take the short way here: a plain,
    non-traditional nn.RoPE over an even number of x's features, on the CPU (a GPU has a rope
    kernel), exact for this dtype and width."""
    return (type(rope) is nn.RoPE and not rope.traditional and x.ndim == 4 and rope.dims % 2 == 0
            and rope.dims <= x.shape[-1] and mx.default_device() == mx.cpu
            and rotation_is_exact(rope, x.dtype, x.shape[-1]))


def table_for(rope: nn.RoPE, positions: mx.array, dtype) -> tuple[mx.array, mx.array, mx.array]:
    """`rotate`'s (cos, sin, swap) at these positions (one per row), for rows of any batch and head
    count (the products broadcast them)."""
    return (*angles(rope, positions, dtype), halves_swapped(rope.dims))


def rope_key(rope: nn.RoPE) -> tuple:
    """What of a rope its rotation depends on (layers with equal ones share tables and the check)."""
    return rope.dims, float(rope.base), float(rope.scale)


def table_key(rope: nn.RoPE, x: mx.array) -> tuple:
    """What a table for x depends on besides its positions: the rope, and what `rotates` reads of x
    (not its batch or head count, so a layer's queries and keys share one)."""
    return *rope_key(rope), x.ndim, x.shape[-1], x.dtype


class BlockAngles:
    """`rotate`'s tables for the latest blocks of positions, per rope: the first layer of a forward
    that asks makes them, the other layers (queries and keys alike) reuse them (a drafter's layer
    rotates two blocks: the new context rows and its own)."""

    KEPT = 8  # tables kept; a forward's are made again when more were asked for since

    def __init__(self):
        self._tables: dict[tuple, tuple[mx.array, mx.array, mx.array]] = {}

    def table(self, rope: nn.Module, offset: int, x: mx.array) -> Optional[tuple[mx.array, mx.array, mx.array]]:
        """`rotate`'s (cos, sin, swap) for x's rows from `offset`, or None where the short rotation
        does not stand in for the rope (`rotates`: asked where no table is kept yet, not at every
        layer's call)."""
        if type(rope) is not nn.RoPE:
            return None
        key = (*table_key(rope, x), offset, x.shape[-2])
        table = self._tables.get(key)
        if table is None and rotates(rope, x):
            if len(self._tables) >= self.KEPT:
                self._tables.clear()
            positions = mx.arange(offset, offset + x.shape[-2], dtype=mx.int32)
            table = self._tables[key] = table_for(rope, positions, x.dtype)
        return table


class BlockRoPE(nn.Module):
    """A layer's rope on the CPU: a block of rows at consecutive positions from an int offset is
    rotated by the forward's shared angles; anything else (one row, an array of offsets, a rope the
    short way does not cover) goes to the rope itself."""

    def __init__(self, rope: nn.Module, shared: BlockAngles):
        super().__init__()
        self.rope = rope
        self.shared = shared

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        block = isinstance(offset, int) and x.ndim == 4 and x.shape[-2] > 1
        table = self.shared.table(self.rope, offset, x) if block else None
        if table is None:
            return self.rope(x, offset=offset)
        return rotate(x, *table)


def stock_rope(rope: nn.Module) -> nn.Module:
    """The rope a BlockRoPE wraps (any other rope as it is)."""
    return rope.rope if isinstance(rope, BlockRoPE) else rope


def rope_holders(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` with a rope of their own (its attention layers), BlockRoPEs left out."""
    return [m for m in model.modules() if not isinstance(m, BlockRoPE)
            and isinstance(m.get("rope") if isinstance(m, dict) else None, nn.Module)]


def install_block_ropes(model: nn.Module, on: bool) -> int:
    """Wrap every attention layer's rope of `model` in a BlockRoPE sharing one BlockAngles (on), or
    unwrap them (off); the number of ropes wrapped."""
    shared, wrapped = BlockAngles(), 0
    for module in rope_holders(model):
        rope = module.rope
        stock = stock_rope(rope)
        if on and type(stock) is nn.RoPE and not stock.traditional:
            module.rope = BlockRoPE(stock, shared)
            wrapped += 1
        elif rope is not stock:
            module.rope = stock
    return wrapped
