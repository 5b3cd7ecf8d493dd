"""The "Why" tab: is the drafter calibrated, which block size pays on this machine, and what a
verify costs here.

Five plots: acceptance against the drafter's confidence (from the run's rounds, live), the
advisor's predicted speedup for every block size with the current one marked, and the cost
curve; below, acceptance and round cost against context depth (live, each round at its anchor's
position, with the mean over each depth range; the AR run's step cost beside it in Both mode); and,
for a run with draft trees, where they paid (app/tree_why.py).
The advice and the curve come from the worker (`Advise block size`): it measures or reads the
cached cost curve of the loaded pair and runs the advisor on this run's rounds.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from engine.decode.confidence import calibration
from engine.decode.depth_stats import DepthStats, round_times, step_times
from engine.decode.events import TextEvent
from app import theme
from app.layout_fit import PLOTS_SLACK, plots_min_width, readable, scrolled
from app.plot_axes import thin_axes
from app.plots import TITLE, empty_bars, translucent_brush
from app.run_record import RunRecord
from app.tree_why import TreeWhy

WHY_PLOTS_HEIGHT = 300  # two rows of plots, readable (the page scrolls below it)
LEGEND_HEADROOM = 0.45  # cost by depth: y range this share of the span above the top point (room for the legend)


def mean_style(colour: str) -> dict:
    """A depth range's mean: a line through the ranges, and a marker on each, so that a run whose
    rounds all fall in one range (a long prompt, 128 tokens) still shows its mean."""
    return dict(pen=pg.mkPen(colour, width=2), symbol="s", symbolSize=8, symbolPen=None, symbolBrush=colour)


class WhyView(QWidget):
    advise_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("whyView")
        self.advise_button = QPushButton("Advise block size")
        self.advise_button.setToolTip("measure (or read the cached) cost curve of the loaded pair and predict "
                                      "every block size's speedup from this run's rounds")
        self.advise_button.clicked.connect(self.advise_requested)
        self.summary = QLabel()
        self.summary.setObjectName("hint")
        self.summary.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.advise_button)
        row.addWidget(self.summary, 1)

        self.plots = pg.GraphicsLayoutWidget()
        self.p_cal = self.plots.addPlot(row=0, col=0, axisItems=thin_axes())
        self.p_cal.setTitle("Accepted vs confidence", **TITLE)
        self.p_cal.setLabel("bottom", "drafter's probability")
        self.p_cal.setLabel("left", "accepted")
        self.p_cal.setRange(xRange=(0, 1), yRange=(0, 1.05))
        self.p_cal.plot([0, 1], [0, 1], pen=pg.mkPen(theme.FOREGROUND, width=1, style=pg.QtCore.Qt.PenStyle.DashLine))
        self.cal_curve = self.p_cal.plot(pen=pg.mkPen(theme.PLOT_DFLASH, width=2), symbol="o", symbolSize=6,
                                         symbolBrush=theme.PLOT_DFLASH)

        self.p_adv = self.plots.addPlot(row=0, col=1, axisItems=thin_axes())
        self.p_adv.setTitle("Speedup by block size", **TITLE)
        self.p_adv.setLabel("bottom", "block size")
        self.adv_bars = empty_bars(theme.PLOT_DFLASH, 170)
        self.adv_current = empty_bars(theme.PLOT_VERIFY, 230)
        self.p_adv.addItem(self.adv_bars)
        self.p_adv.addItem(self.adv_current)
        self.p_adv.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen(theme.PLOT_AR, width=1)))
        self.adv_auto = pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.PLOT_ROLLBACK, width=1,
                                                              style=pg.QtCore.Qt.PenStyle.DashLine))
        self.p_adv.addItem(self.adv_auto)
        self.adv_auto.hide()

        self.p_cost = self.plots.addPlot(row=0, col=2, axisItems=thin_axes())
        self.p_cost.setTitle("Cost curve (ms)", **TITLE)
        self.p_cost.setLabel("bottom", "verified positions")
        self.cost_verify = self.p_cost.plot(pen=pg.mkPen(theme.PLOT_VERIFY, width=2), symbol="o", symbolSize=5,
                                            symbolBrush=theme.PLOT_VERIFY)
        self.cost_ar = pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.PLOT_AR, width=1))
        self.p_cost.addItem(self.cost_ar)
        self.cost_ar.hide()

        self.p_depth_acc = self.plots.addPlot(row=1, col=0, axisItems=thin_axes())
        self.p_depth_acc.setTitle("Acceptance length by depth", **TITLE)
        self.p_depth_acc.setLabel("bottom", "context depth (tokens)")
        self.depth_acc_dots = self.p_depth_acc.plot(pen=None, symbol="o", symbolSize=4, symbolPen=None,
                                                    symbolBrush=translucent_brush(theme.PLOT_DFLASH, 110))
        self.depth_acc_mean = self.p_depth_acc.plot(**mean_style(theme.PLOT_DFLASH))

        self.p_depth_cost = self.plots.addPlot(row=1, col=1, colspan=2, axisItems=thin_axes())
        self.p_depth_cost.setTitle("Cost by depth (ms)", **TITLE)
        self.p_depth_cost.setLabel("bottom", "context depth (tokens)")
        # Which colour is which (a QA pass asked): one row along the top on a translucent ground, so
        # it hides few points (stacked, it covered the plot's upper left)
        self.p_depth_cost.addLegend(offset=(6, 2), labelTextSize="8pt", colCount=3, verSpacing=-6,
                                    brush=translucent_brush(theme.BACKGROUND, 150))
        self.depth_cost_dots = self.p_depth_cost.plot(pen=None, symbol="o", symbolSize=4, symbolPen=None,
                                                      symbolBrush=translucent_brush(theme.PLOT_VERIFY, 110),
                                                      name="a round")
        self.depth_cost_mean = self.p_depth_cost.plot(**mean_style(theme.PLOT_VERIFY), name="round, mean")
        self.depth_ar_mean = self.p_depth_cost.plot(**mean_style(theme.PLOT_AR), name="AR step, mean")

        readable(self.plots, WHY_PLOTS_HEIGHT)
        # never narrower than its grid can be read at (a narrow centre column clipped the third plot's title
        # and the legend on the right): the page scrolls across instead
        self.plots.setMinimumWidth(plots_min_width(self.plots) - PLOTS_SLACK)
        lay = QVBoxLayout(scrolled(self))
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(row)
        lay.addWidget(self.plots, 1)
        self.trees = TreeWhy()  # a run with draft trees: where they paid (hidden otherwise)
        lay.addWidget(self.trees)
        self.advice: Optional[dict] = None
        self.clear()

    def clear(self) -> None:
        self.cal_curve.setData([], [])
        self.adv_bars.setOpts(x=np.zeros(0), height=np.zeros(0))
        self.adv_current.setOpts(x=np.zeros(0), height=np.zeros(0))
        self.adv_auto.hide()
        self.cost_verify.setData([], [])
        self.cost_ar.hide()
        for curve in (self.depth_acc_dots, self.depth_acc_mean, self.depth_cost_dots, self.depth_cost_mean,
                      self.depth_ar_mean):
            curve.setData([], [])
        self.advice = None
        self.trees.update_run(None)
        self.summary.setText("Run DFlash, then press Advise block size.")

    def update_run(self, run: Optional[RunRecord], ar_run: Optional[RunRecord] = None) -> None:
        """The calibration plot from the run's rounds (those that carry confidences), and the depth
        plots from its rounds and the AR run's steps."""
        self.trees.update_run(run)
        points = calibration(run.rounds) if run is not None else []
        self.cal_curve.setData([p for p, _, _ in points], [a for _, a, _ in points])
        rounds = run.rounds if run is not None else []
        times = round_times(rounds)
        self.depth_acc_dots.setData([d for d, _ in times], [r.accepted + 1 for r in rounds])
        self.depth_cost_dots.setData([d for d, _ in times], [1000.0 * s for _, s in times])
        stats = DepthStats()
        stats.add_rounds(rounds)
        if ar_run is not None and ar_run.summary is not None:
            stats.add_steps(step_times([e for e in ar_run.events if isinstance(e, TextEvent)],
                                       ar_run.summary.prompt_tokens))
        rows = stats.rows()
        with_tau = [(b.round_depth, b.tau) for b in rows if b.tau is not None]
        self.depth_acc_mean.setData([m for m, _ in with_tau], [t for _, t in with_tau])
        with_cost = [(b.round_depth, b.round_ms) for b in rows if b.round_ms is not None]
        self.depth_cost_mean.setData([m for m, _ in with_cost], [c for _, c in with_cost])
        with_ar = [(b.ar_depth, 1000.0 / b.ar_tok_s) for b in rows if b.ar_tok_s]
        self.depth_ar_mean.setData([m for m, _ in with_ar], [c for _, c in with_ar])
        costs = [1000.0 * s for _, s in times] + [c for _, c in with_ar]
        if costs:  # headroom above the highest point for the legend's row, so it hides none of them
            low, high = min(costs), max(costs)
            span = max(high - low, 0.1 * high, 1e-3)
            self.p_depth_cost.setYRange(max(low - 0.05 * span, 0.0), high + LEGEND_HEADROOM * span, padding=0)
        else:
            self.p_depth_cost.enableAutoRange(axis="y")

    def show_advice(self, curve: dict, advice: Optional[dict], current: Optional[int], note: str = "") -> None:
        lengths = np.arange(1, len(curve["verify_ms"]) + 1, dtype=float)
        self.cost_verify.setData(lengths, np.asarray(curve["verify_ms"], dtype=float))
        self.cost_ar.setValue(curve["ar_step_ms"])
        self.cost_ar.show()
        self.advice = advice
        if advice is None:
            self.summary.setText("No DFlash rounds to learn from: run DFlash first." + note)
            return
        x = np.asarray(advice["lengths"], dtype=float)
        y = np.asarray(advice["speedup"], dtype=float)
        mine = (x == current) if current else np.zeros(len(x), dtype=bool)
        self.adv_bars.setOpts(x=x[~mine], height=y[~mine])
        self.adv_current.setOpts(x=x[mine], height=y[mine])
        self.adv_auto.setValue(advice["auto_speedup"])
        self.adv_auto.show()
        best = advice["best"]
        now = f"block {current}: ×{advice['speedup'][current - 1]:.2f} predicted; " if current else ""
        self.summary.setText(
            f"{now}best fixed block size {best}: ×{advice['speedup'][best - 1]:.2f}; auto ≈ ×{advice['auto_speedup']:.2f} "
            f"(dashed). From {advice['rounds']} rounds and this machine's cost curve (AR step "
            f"{curve['ar_step_ms']:.2f} ms, the flat line).{note}")
