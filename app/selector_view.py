"""The "Selector" tab: a DFlash2 drafter's candidate selector at work.

Above, two plots over the run (engine/decode/selector_stats.py): where the target's token ranked
among the selector's candidates (or that it was none of them), and how the drafts the selector
rescored away from the head's plain argmax fared. Below, the selected round: one row per drafted
position with its candidates best score first, the one drafted (the selector's path), the plain
argmax and the target's choice marked. A run whose drafter is DFlash v1 (or an old trace) shows
a one-line empty state instead.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics
from PySide6.QtWidgets import (
    QAbstractItemView, QHeaderView, QLabel, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from engine.decode.selector_stats import has_selector, miss, positions, selector_stats
from app import theme
from app.layout_fit import readable, scrolled
from app.plots import TITLE, empty_bars, translucent_brush
from app.run_record import RunRecord
from app.tokens import chip_text

NO_RUN = ("Run DFlash with a DFlash2 drafter to see its candidate selector at work: the candidates at "
          "each drafted position, where the target's token ranked among them, and how often the "
          "selector's rescoring changed the drafter's plain argmax.")
V1 = "This run's drafter is DFlash v1: no candidate selector."
NO_ROUNDS = "No drafted positions yet."
# runs whose drafts never came from a DFlash drafter, by mode
NOT_DFLASH = {
    "ar": "Plain AR decoding drafts nothing: no candidate selector.",
    "lookup": "This run's drafts are copies of the context (lookup): no candidate selector.",
    "draft-model": "This run's drafts come from a draft model, one token at a time: no candidate selector.",
}
SUMMARY_TIP = ("judged drafts: those the target saw after a fully accepted prefix (a round's accepted drafts "
               "and its first rejected one).\nrescored: the selector drafted another token than the drafter "
               "head's plain argmax; the argmax was right: it was the target's own choice.\nthe selector's miss: "
               "the block broke where the target's token was a candidate the selector did not draft; the "
               "drafter's miss: it was none of the candidates.")
PICK = "Select a round in the table below the tabs (double-click one to open it here)."
FIXED = ("draft", "result", "target", "plain argmax")
RESCORED_Y = (1, 0)  # the bars' rows: kept on top, rescored below
MARKS_ROLE = Qt.ItemDataRole.UserRole + 1  # a candidate cell's marks: "drafted", "target", "plain"
MAX_SHOWN = 32  # candidate columns shown at most (a checkpoint may carry a K of thousands)
KEY = ("<span style='background:%s; color:#fff'>&nbsp;drafted, accepted&nbsp;</span>&nbsp; "
       "<span style='background:%s; color:%s'>&nbsp;drafted, rejected&nbsp;</span>&nbsp; "
       "<span style='background:%s'>&nbsp;after the break&nbsp;</span>&nbsp; "
       "<span style='background:%s; color:#fff'>&nbsp;the target's choice&nbsp;</span>&nbsp; "
       "<u>underlined</u>: plain argmax"
       % (theme.CHIP_ACCEPTED, theme.CHIP_REJECTED, theme.CHIP_REJECTED_TEXT, theme.CHIP_REJECTED,
          theme.CHIP_CORRECTION))

TABLE_ROWS = 4  # the candidates' table shows at least this many rows
SELECTOR_PLOTS_HEIGHT = 170  # the rank and rescoring plots, readable (the page scrolls below it)


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:.0f}%" if total else "–"


def run_summary(stats: dict[str, Any]) -> str:
    """The run's selector in two short lines (SUMMARY_TIP says what the words mean)."""
    judged, k, m = stats["judged"], stats["top_k"], stats["misses"]
    found = judged - stats["not_candidate"]
    best = stats["rank_counts"][0] if k else 0
    text = (f"{judged} judged drafts, top-{k}: the target's token a candidate {_share(found, judged)}, the best "
            f"{_share(best, judged)} · argmax rescored {_share(stats['rescored'], judged)} "
            f"({stats['rescored_accepted']} accepted, {stats['rescored_plain_was_target']} where it was right) · "
            f"breaks: {m['selector']} the selector's miss, {m['drafter']} the drafter's")
    return text + (f", {m['sampling']} sampling" if m["sampling"] else "")


def round_summary(r: Any, table, k: int) -> str:
    """What became of one round's drafts, and whose miss the break was."""
    n = len(positions(r))
    if n == 0:
        return f"Round {r.index} drafted nothing."
    text = f"Round {r.index} (position {r.position}): {r.accepted} of {n} drafts accepted"
    broke = miss(r)
    if broke is None:
        return text + f", then the bonus {chip_text(table, r.bonus)}."
    text += f"; draft {broke['position']} broke: "
    if broke["kind"] == "drafter":
        return text + (f"the target's token was none of the {k} candidates (the drafter's miss); it put "
                       f"{chip_text(table, r.bonus)} (id {r.bonus}) there.")
    choice = chip_text(table, broke["target_choice"])
    if broke["kind"] == "selector":
        return text + (f"the target's choice {choice} was candidate #{broke['target_rank'] + 1}, but the selector "
                       f"drafted {chip_text(table, broke['drafted'])} (the selector's miss).")
    return text + f"the draft {choice} was the target's choice, rejected by the draw (a sampling miss)."


def no_selector(run: RunRecord) -> str:
    """Why a run shows no selector at work: its mode drafts otherwise, its drafter is v1, or nothing was
    drafted yet."""
    mode = run.start.settings.get("mode")
    if mode in NOT_DFLASH:
        return NOT_DFLASH[mode]
    return NO_ROUNDS if run.start.model.get("drafter_generation") == "DFlash2" else V1


class SelectorView(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("selectorView")
        self.run: Optional[RunRecord] = None
        self.round_index: Optional[int] = None
        self.stats: Optional[dict[str, Any]] = None
        self.empty = QLabel()
        self.empty.setObjectName("hint")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.body = QSplitter(Qt.Orientation.Vertical)
        self.body.addWidget(self._build_run_part())
        self.body.addWidget(self._build_round_part())
        self.body.setSizes([220, 240])
        lay = QVBoxLayout(scrolled(self))
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.empty, 1)
        lay.addWidget(self.body, 1)
        self.clear()

    def _build_run_part(self) -> QWidget:
        """The run's summary line and its two plots."""
        self.summary = QLabel()
        self.summary.setObjectName("hint")
        self.summary.setWordWrap(True)
        self.summary.setToolTip(SUMMARY_TIP)
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.ci.setSpacing(4)
        self.p_rank = self.plots.addPlot(row=0, col=0, rowspan=2)
        self.p_rank.setTitle("Rank of the target's token among the candidates", **TITLE)
        self.p_rank.setMouseEnabled(x=False, y=False)
        self.rank_bars = empty_bars(theme.PLOT_DFLASH, 200)
        self.none_bar = empty_bars(theme.CHIP_CORRECTION, 220)
        self.p_rank.addItem(self.rank_bars)
        self.p_rank.addItem(self.none_bar)

        # Two horizontal bars (they fit a short plot), each stacked left to right from separate items.
        # Their legend, in a row of its own above, is the plot's title.
        self.p_rescore = self.plots.addPlot(row=1, col=1)
        self.p_rescore.setMouseEnabled(x=False, y=False)
        self.p_rescore.getAxis("left").setTicks([[(RESCORED_Y[0], "argmax kept"), (RESCORED_Y[1], "rescored")]])
        self.p_rescore.getAxis("bottom").setTicks([[(0, "0"), (0.5, ".5"), (1, "1")]])
        self.p_rescore.setRange(xRange=(0, 1.02), yRange=(-0.6, 1.6), padding=0)
        self.rescore_bars = {}
        for key, colour in (("accepted", theme.CHIP_ACCEPTED), ("argmax right", theme.CHIP_CORRECTION),
                            ("rejected", theme.PLOT_AR)):
            bar = pg.BarGraphItem(x0=np.zeros(0), width=np.zeros(0), y=np.zeros(0), height=0.6,
                                  brush=translucent_brush(colour, 220), pen=pg.mkPen(None))
            self.p_rescore.addItem(bar)
            self.rescore_bars[key] = bar
        # two columns: three ran past a 1024-pixel window's edge ("rejecte")
        self.legend = pg.LegendItem(colCount=2, labelTextSize="8pt", labelTextColor=theme.FOREGROUND)
        for key, bar in self.rescore_bars.items():
            self.legend.addItem(bar, key)
        self.plots.addItem(self.legend, row=0, col=1)
        self.plots.ci.layout.setRowMaximumHeight(0, 44)  # the legend's rows; the plots take the rest
        self.plots.ci.layout.setColumnStretchFactor(0, 3)
        self.plots.ci.layout.setColumnStretchFactor(1, 2)
        self.p_rank.getAxis("left").setTicks([[(0, "0"), (0.5, ".5"), (1, "1")]])  # few ticks fit a short plot
        self.plots.setToolTip("shares of the judged drafts (summary above); left: where the target's token ranked "
                              "among the selector's candidates (1: the best-scored), none: not a candidate; right: "
                              "drafts that kept the head's plain argmax or that the selector rescored, and how "
                              "they fared (argmax right: rejected, where the plain argmax was the target's token)")
        part = QWidget()
        lay = QVBoxLayout(part)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.summary)
        lay.addWidget(self.plots, 1)
        readable(self.plots, SELECTOR_PLOTS_HEIGHT)
        return part

    def _build_round_part(self) -> QWidget:
        """The selected round: its summary line, the table of candidates and the table's colour key."""
        self.round_label = QLabel()
        self.round_label.setWordWrap(True)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setWordWrap(False)
        self.key = QLabel(KEY)
        self.key.setObjectName("hint")
        self.key.setWordWrap(True)
        self.font = theme.chip_font(8.5)
        self.table.setFont(self.font)
        self.table.verticalHeader().setDefaultSectionSize(QFontMetrics(self.font).height() + 6)
        # a few candidates' rows at least (a short page showed one): the page scrolls instead
        self.table.setMinimumHeight(TABLE_ROWS * (QFontMetrics(self.font).height() + 6) + 30)
        part = QWidget()
        lay = QVBoxLayout(part)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.round_label)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.key)
        return part

    # ---- the run ---------------------------------------------------------------------------

    def _show_empty(self, text: str) -> None:
        self.empty.setText(text)
        self.empty.show()
        self.body.hide()

    def clear(self) -> None:
        self.run, self.round_index, self.stats = None, None, None
        self._set_plots(None)
        self.summary.setText("")
        self._show_round(None)
        self._show_empty(NO_RUN)

    def update_run(self, run: Optional[RunRecord]) -> None:
        """The plots and summary from the run's rounds; the empty state when they carry no candidates."""
        if run is None:
            self.clear()
            return
        if run is not self.run:
            self.run, self.round_index = run, None
            self._show_round(None)
        self.stats = selector_stats(run.rounds)
        self._set_plots(self.stats)
        if self.stats is None:
            self._show_empty(no_selector(run))
            return
        self.summary.setText(run_summary(self.stats))
        self.empty.hide()
        self.body.show()
        if self.round_index is not None and self.table.rowCount() == 0:  # picked before its run had stats
            self._show_round(self.round_index)

    def _set_plots(self, stats: Optional[dict[str, Any]]) -> None:
        k = stats["top_k"] if stats else 0
        judged = max(stats["judged"], 1) if stats else 1
        ranks = np.asarray(stats["rank_counts"] if stats else [], dtype=float) / judged
        self.rank_bars.setOpts(x=np.arange(1, k + 1, dtype=float), height=ranks)
        self.none_bar.setOpts(x=np.asarray([k + 2.0] if stats else []),
                              height=np.asarray([stats["not_candidate"] / judged] if stats else []))
        step = next(s for s in (1, 2, 4, 5, 10, 20, 50, 100, 200, 500, 1000, 10 ** 9) if k <= 10 * s)
        ticks = [(i, str(i)) for i in range(1, k + 1) if i == 1 or i % step == 0] + ([(k + 2, "none")] if stats else [])
        self.p_rank.getAxis("bottom").setTicks([ticks])  # "none" stands apart: it is no rank
        self.p_rank.setXRange(0.4, k + 3.2, padding=0)
        self.p_rank.setYRange(0, 1.05, padding=0)
        if stats:
            kept, rescored = stats["kept"], stats["rescored"]
            accepted = np.asarray([stats["kept_accepted"], stats["rescored_accepted"]], dtype=float) / judged
            was_target = np.asarray([0.0, stats["rescored_plain_was_target"]]) / judged
            total = np.asarray([kept, rescored], dtype=float) / judged
        else:
            accepted = was_target = total = np.zeros(0)
        y = np.asarray(RESCORED_Y[: len(total)], dtype=float)
        self.rescore_bars["accepted"].setOpts(y=y, x0=np.zeros(len(y)), width=accepted)
        self.rescore_bars["argmax right"].setOpts(y=y, x0=accepted, width=was_target)
        self.rescore_bars["rejected"].setOpts(y=y, x0=accepted + was_target, width=total - accepted - was_target)

    def series(self) -> dict[str, np.ndarray]:
        """What the plots hold now: shares of the judged drafts."""
        out = {"rank": np.asarray(self.rank_bars.opts["height"], dtype=float),
               "not_candidate": np.asarray(self.none_bar.opts["height"], dtype=float)}
        for key, bar in self.rescore_bars.items():  # [kept, rescored]
            out[key] = np.asarray(bar.opts["width"], dtype=float)
        return out

    # ---- one round -------------------------------------------------------------------------

    def show_round(self, run: Optional[RunRecord], index: int) -> None:
        """The round's candidates per drafted position (kept while new rounds arrive)."""
        if run is not self.run:
            self.update_run(run)
        self.round_index = index
        self._show_round(index)

    def _show_round(self, index: Optional[int]) -> None:
        run = self.run
        r = run.rounds[index] if run is not None and index is not None and 0 <= index < len(run.rounds) else None
        self.table.clear()
        if r is None or self.stats is None:
            self.table.setRowCount(0)
            self.table.setColumnCount(0)
            self.round_label.setText(PICK)
            return
        k = self.stats["top_k"]
        shown = min(k, MAX_SHOWN)
        self.round_label.setText(round_summary(r, run.table, k) if has_selector(r) or not r.drafted
                                 else f"Round {r.index} carries no candidates.")
        rows = positions(r)
        self.table.setColumnCount(len(FIXED) + shown)
        self.table.setHorizontalHeaderLabels(list(FIXED) + [f"#{i + 1}" for i in range(shown)])
        for c in range(shown):
            self.table.horizontalHeaderItem(len(FIXED) + c).setToolTip(
                f"the selector's candidate #{c + 1} of {k} by score (#1: the best), with its score")
        self.table.setRowCount(len(rows))
        for n, row in enumerate(rows):
            self._fill_row(n, row, run.table, k, shown)

    def _item(self, text: str, tip: str = "", colour: Optional[str] = None) -> QTableWidgetItem:
        item = QTableWidgetItem(text)
        item.setToolTip(tip or text)
        if colour:
            item.setForeground(QBrush(QColor(colour)))
        return item

    def _fill_row(self, n: int, row: dict[str, Any], table, k: int, shown: int) -> None:
        status, rank = row["status"], row["target_rank"]
        self.table.setItem(n, 0, self._item(str(row["position"]), "draft position in the block"))
        colour = {"accepted": theme.PLOT_DFLASH, "rejected": theme.CHIP_REJECTED_TEXT}.get(status, theme.MUTED)
        self.table.setItem(n, 1, self._item(status, colour=colour))
        where = (f"#{rank + 1}", f"the target's choice was candidate #{rank + 1} of {k}") if rank >= 0 else \
            ("not a candidate", f"the target's choice was none of the {k} candidates")
        self.table.setItem(n, 2, self._item(*where, colour=None if rank >= 0 else theme.CHIP_CORRECTION))
        if row["rescored"]:
            ids = [c for c, _ in row["candidates"]]
            plain_rank = ids.index(row["plain_top"]) + 1 if row["plain_top"] in ids else None
            text = chip_text(table, row["plain_top"], 10) + (f" (#{plain_rank})" if plain_rank else "")
            self.table.setItem(n, 3, self._item(text, "the selector's rescoring drafted another token than the "
                                                      "head's plain argmax", theme.ROUND_HIGHLIGHT))
        else:
            self.table.setItem(n, 3, self._item("= drafted", "the selector kept the head's plain argmax", theme.MUTED))
        for c, (token, score) in enumerate(row["candidates"][:shown]):
            self.table.setItem(n, len(FIXED) + c, self._candidate(row, c, token, score, table, k))

    def _candidate(self, row: dict[str, Any], c: int, token: int, score: float, table, k: int) -> QTableWidgetItem:
        marks = []
        if token == row["drafted"]:
            marks.append("drafted")
        if token == row["target_choice"]:
            marks.append("target")
        if token == row["plain_top"]:
            marks.append("plain")
        tip = f"candidate #{c + 1} of {k}: {chip_text(table, token, 40)} (id {token}), selector score {score:.3f}"
        tip += "".join({"drafted": "\n· the selector drafted it", "target": "\n· the target's choice",
                        "plain": "\n· the head's plain argmax"}[m] for m in marks)
        item = self._item(f"{chip_text(table, token, 10)} {score:.1f}", tip)
        item.setData(MARKS_ROLE, marks)
        font = QFont(self.font)
        if "drafted" in marks:
            status = row["status"]
            item.setBackground(QColor(theme.CHIP_ACCEPTED if status == "accepted" else theme.CHIP_REJECTED))
            item.setForeground(QColor({"accepted": "#ffffff", "rejected": theme.CHIP_REJECTED_TEXT}.get(
                status, theme.FOREGROUND)))
            font.setStrikeOut(status == "rejected")
        elif "target" in marks:
            item.setBackground(QColor(theme.CHIP_CORRECTION))
            item.setForeground(QColor("#ffffff"))
        elif row["status"] == "after the break":
            item.setForeground(QColor(theme.MUTED))
        font.setUnderline("plain" in marks)
        font.setBold("plain" in marks and row["rescored"])
        item.setFont(font)
        return item
