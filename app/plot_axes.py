"""Axes whose tick labels never run into each other: on a short plot (a 1280x800 laptop) pyqtgraph's
own spacing stacked "10 8 6 4 2 0" on a 60-pixel axis; these keep a label's height (or width) apart."""

from __future__ import annotations

import math

import pyqtgraph as pg

GAP_PX = {"left": 22, "right": 22, "bottom": 56, "top": 56}  # the least room between two labelled ticks


class ThinAxis(pg.AxisItem):
    """An AxisItem whose labelled ticks are at least GAP_PX apart (the next round spacing that is); only
    the major ticks are labelled (pyqtgraph's minor labels ran into them: "0.40.50.6")."""

    def __init__(self, orientation: str, **kwargs):
        super().__init__(orientation, **kwargs)
        self.setStyle(maxTextLevel=0)

    def tickSpacing(self, minVal, maxVal, size):  # noqa: N802 (pyqtgraph API)
        levels = super().tickSpacing(minVal, maxVal, size)
        span = maxVal - minVal
        if not levels or span <= 0 or size <= 0:
            return levels
        spacing, offset = levels[0]
        least = GAP_PX[self.orientation] * span / size  # in data units
        if spacing >= least:
            return levels
        return [(nice_above(least), 0), (spacing, offset)]  # the old spacing as minor ticks


def nice_above(x: float) -> float:
    """The least of 1, 2, 2.5, 5 times a power of ten that is at least `x` (> 0)."""
    power = 10.0 ** math.floor(math.log10(x))
    return next(power * m for m in (1, 2, 2.5, 5, 10) if power * m >= x * (1 - 1e-9))


def thin_axes() -> dict[str, ThinAxis]:
    """addPlot(axisItems=thin_axes()): the left and bottom axes."""
    return {"left": ThinAxis("left"), "bottom": ThinAxis("bottom")}


def labelled_ticks(plot: pg.PlotItem, name: str) -> list[float]:
    """The values an axis labels now (as drawn: its top tick level)."""
    axis = plot.getAxis(name)
    low, high = axis.range
    size = axis.height() if name in ("left", "right") else axis.width()
    levels = axis.tickValues(low, high, size)
    return list(levels[0][1]) if levels else []
