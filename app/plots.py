"""Live plots (pyqtgraph): throughput over time (one curve per run: AR and DFlash, or each method of
a race), acceptance per round and per block position, and stacked draft / verify / rollback time
per round."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QCoreApplication, QEvent, QRectF, QSize
from PySide6.QtGui import QColor, QImage, QPainter

from engine.errors import DFlashError
from engine.safe_write import atomic_path, check_output
from app import theme
from app.plot_axes import thin_axes
from app.run_record import RunRecord


def _edges(n: int) -> np.ndarray:
    """Bin edges centred on 0..n-1, for stepMode='center' curves."""
    return np.arange(n + 1, dtype=float) - 0.5


SLIDE_SIZE = QSize(1600, 900)  # pixels the saved plots are laid out in, at least (a 16:9 slide)
TITLE = {"size": "9pt", "color": theme.FOREGROUND}  # plot titles, here and in the Why tab


def translucent_brush(colour: str, alpha: int = 150):
    c = pg.mkColor(colour)
    c.setAlpha(alpha)
    return pg.mkBrush(c)


def empty_bars(colour: str, alpha: int) -> pg.BarGraphItem:
    """Vertical bars with no data yet (setOpts fills them), borderless, in a translucent colour."""
    return pg.BarGraphItem(x=np.zeros(0), height=np.zeros(0), width=0.7,
                           brush=translucent_brush(colour, alpha), pen=pg.mkPen(None))


def _reset_range(plot: pg.PlotItem) -> None:
    """An empty plot's axes at 0..1, then following the next data again."""
    plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
    plot.enableAutoRange()


class PlotsPanel(pg.GraphicsLayoutWidget):
    """Four plots in a grid; `update_runs` redraws from the records (cheap: arrays of a few thousand)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("plots")
        self.ci.setSpacing(6)

        # Legends sit in rows of their own above their plots, never over the data.
        self.p_tps = self.addPlot(row=1, col=0, axisItems=thin_axes())
        self.p_tps.setTitle("Throughput (tok/s)", **TITLE)
        self.p_tps.setLabel("bottom", "time since first token", units="s")
        # One curve per run label: DFlash and AR always, a race's other methods while they are shown.
        self.tps_curves = {}
        for label in ("dflash", "ar"):
            self._tps_curve(label)
        self.tps_legend = self._legend_above(self.p_tps, row=0, col=0)

        self.p_acc = self.addPlot(row=1, col=1, axisItems=thin_axes())
        self.p_acc.setTitle("Acceptance length per round (tokens)", **TITLE)
        self.p_acc.setLabel("bottom", "round")
        self.acc_curve = self.p_acc.plot(stepMode="center", fillLevel=0,
                                         brush=translucent_brush(theme.PLOT_DFLASH, 120),
                                         pen=pg.mkPen(theme.PLOT_DFLASH, width=1))

        self.p_pos = self.addPlot(row=3, col=0, axisItems=thin_axes())
        self.p_pos.setTitle("Acceptance rate by block position", **TITLE)
        self.p_pos.setLabel("bottom", "draft position in block")
        self.p_pos.setYRange(0, 1.05)
        self.pos_bars = empty_bars(theme.PLOT_DFLASH, 200)
        self.p_pos.addItem(self.pos_bars)

        self.p_time = self.addPlot(row=3, col=1, axisItems=thin_axes())
        self.p_time.setTitle("Round time (ms), stacked", **TITLE)
        self.p_time.setLabel("bottom", "round")
        # Drawn back to front: the total (rollback on top), then draft + verify, then draft.
        self.time_curves = {}
        for key, name, colour in (("rollback", "rollback", theme.PLOT_ROLLBACK),
                                  ("verify", "verify", theme.PLOT_VERIFY),
                                  ("draft", "draft", theme.PLOT_DRAFT)):
            self.time_curves[key] = self.p_time.plot(name=name, stepMode="center", fillLevel=0,
                                                     brush=translucent_brush(colour, 190),
                                                     pen=pg.mkPen(colour, width=1))
        self.time_legend = self._legend_above(self.p_time, row=2, col=1, order=("draft", "verify", "rollback"))
        self.clear_plots()

    def _legend_above(self, plot: pg.PlotItem, row: int, col: int, order: tuple[str, ...] = ()) -> pg.LegendItem:
        """A one-line legend in its own layout cell above `plot`."""
        items = {item.name(): item for item in plot.listDataItems()}
        names = [n for n in order if n in items] + [n for n in items if n not in order]
        legend = pg.LegendItem(colCount=len(names), labelTextSize="8pt", labelTextColor=theme.FOREGROUND)
        for name in names:
            legend.addItem(items[name], name)
        self.addItem(legend, row=row, col=col)
        return legend

    def _tps_curve(self, label: str) -> pg.PlotDataItem:
        """The throughput curve of a run label (a race method's name), made and put in the legend when
        first needed."""
        curve = self.tps_curves.get(label)
        if curve is None:
            colour = theme.PLOT_METHOD.get(label, theme.FOREGROUND)
            curve = self.tps_curves[label] = self.p_tps.plot(name=theme.METHOD_LABEL.get(label, label),
                                                             pen=pg.mkPen(colour, width=2))
            # listed by _legend_lists, once it is a run's (a race's six names in two rows)
        return curve

    def clear_plots(self) -> None:
        for label in [k for k in self.tps_curves if k not in ("dflash", "ar")]:  # a race's extra methods
            curve = self.tps_curves.pop(label)
            self.tps_legend.removeItem(curve)
            self.p_tps.removeItem(curve)
        for c in self.tps_curves.values():
            c.setData([], [])
        self._legend_lists({})
        _reset_range(self.p_tps)
        self._clear_round_plots()

    def _clear_round_plots(self) -> None:
        """No rounds on show (an AR run, a stopped one): empty, and at ranges of their own, not the last run's."""
        self.acc_curve.setData(_edges(0), np.zeros(0))
        self.pos_bars.setOpts(x=np.zeros(0), height=np.zeros(0))
        for c in self.time_curves.values():
            c.setData(_edges(0), np.zeros(0))
        for plot in (self.p_acc, self.p_time):
            _reset_range(plot)
        self.p_pos.setXRange(0, 1, padding=0)
        self.p_pos.enableAutoRange(axis="x")

    def _legend_lists(self, runs: dict[str, RunRecord]) -> None:
        """The throughput legend names the runs on show (no AR after a DFlash-only run), or both labels
        before any run, as the key to what a run draws."""
        shown = [label for label in self.tps_curves if label in runs] or list(self.tps_curves)
        listed = [label.text for _sample, label in self.tps_legend.items]
        names = [self.tps_curves[label].name() for label in shown]
        if listed == names:
            return
        self.tps_legend.clear()
        for label in shown:
            self.tps_legend.addItem(self.tps_curves[label], self.tps_curves[label].name())
        self.tps_legend.setColumnCount(min(len(shown), 3))

    def update_runs(self, runs: dict[str, RunRecord], rounds_run: Optional[RunRecord]) -> None:
        """Throughput for every run (by label: mode, or a race's method); the round plots from `rounds_run`."""
        for label in runs:
            self._tps_curve(label)
        for mode, curve in self.tps_curves.items():
            run = runs.get(mode)
            if run is None:
                curve.setData([], [])
            else:
                curve.setData(np.asarray(run.tps_t, dtype=float), np.asarray(run.tps_v, dtype=float))
        self._legend_lists(runs)
        if not runs:
            _reset_range(self.p_tps)
        if rounds_run is None:
            self._clear_round_plots()
            return
        acc = np.asarray(rounds_run.acc_len, dtype=float)
        self.acc_curve.setData(_edges(len(acc)), acc)
        rates = np.asarray(rounds_run.per_position_acceptance, dtype=float)
        self.pos_bars.setOpts(x=np.arange(1, len(rates) + 1, dtype=float), height=rates)
        draft = np.asarray(rounds_run.stats.draft_ms, dtype=float)
        verify = draft + np.asarray(rounds_run.stats.verify_ms, dtype=float)
        total = verify + np.asarray(rounds_run.stats.rollback_ms, dtype=float)
        edges = _edges(len(draft))
        self.time_curves["draft"].setData(edges, draft)
        self.time_curves["verify"].setData(edges, verify)
        self.time_curves["rollback"].setData(edges, total)

    def slide_image(self) -> QImage:
        """The plots' grid laid out at SLIDE_SIZE at least and drawn there (then put back to the window's
        size): a 776x352 grab of a laptop's tab was too crowded and small to show, and a tab not on show
        keeps a stale size."""
        shown = self.ci.geometry()
        area = QRectF(0, 0, max(shown.width(), SLIDE_SIZE.width()), max(shown.height(), SLIDE_SIZE.height()))
        self.ci.setGeometry(area)
        QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)  # pyqtgraph lays the grid out again
        image = QImage(area.size().toSize(), QImage.Format.Format_ARGB32)
        image.fill(QColor(theme.BACKGROUND))
        painter = QPainter(image)
        try:
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            self.scene().render(painter, QRectF(image.rect()), area)
        finally:
            painter.end()
        self.ci.setGeometry(shown)
        QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)
        return image

    def series(self) -> dict[str, np.ndarray]:
        """What each plot holds now (y values; bars as heights)."""
        out = {}
        for mode, curve in self.tps_curves.items():
            x, y = curve.getData()
            out[f"tps_{mode}_t"] = np.asarray(x if x is not None else [], dtype=float)
            out[f"tps_{mode}"] = np.asarray(y if y is not None else [], dtype=float)
        out["acceptance_length"] = np.asarray(self.acc_curve.yData if self.acc_curve.yData is not None else [])
        out["position_rate"] = np.asarray(self.pos_bars.opts["height"], dtype=float)
        for key, curve in self.time_curves.items():
            out[f"stack_{key}"] = np.asarray(curve.yData if curve.yData is not None else [])
        return out

    def save_png(self, path: str | Path) -> bool:
        """A PNG of all four plots for a slide, laid out at SLIDE_SIZE at least."""
        path = Path(path)
        try:
            check_output(path, "the plots")
        except DFlashError:
            return False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path, ".png") as tmp:
                if not self.slide_image().save(str(tmp), "PNG"):
                    raise OSError("Qt could not save it")
        except OSError:
            return False
        return True
