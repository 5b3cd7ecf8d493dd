"""The rounds timeline: one row per DFlash round, the block painted as token chips.

A QAbstractTableModel over the run's round list plus a delegate that paints the
chips, so thousands of rounds cost one row of painting per visible row and
no widget per chip.
"""

from __future__ import annotations

from typing import Any, Optional

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView, QHeaderView, QLabel, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QTableView,
)

from engine.decode.events import RoundEvent
from engine.decode.tree_stats import is_tree_round
from app import theme
from app.round_text import round_tooltip, why_lines  # noqa: F401 (why_lines: the tooltip's, for its tests)
from app.run_record import RunRecord
from app.tokens import chip_text

ROUND_ROLE = Qt.ItemDataRole.UserRole + 1
COLUMNS = ("#", "pos", "block: anchor | drafts | bonus", "acc", "draft", "verify", "rollback", "t (s)")
HEADER_TIPS = ("round index", "absolute position of the anchor token",
               "the anchor, the drafted tokens (accepted green, rejected struck through) and the bonus "
               "(blue) or correction (orange) token; each draft's left edge says where it came from (the "
               "legend below); when a block is wider than the column, …k stands "
               "for k drafts in the middle (the row's tooltip lists them all); \"tree N\" marks a round "
               "that verified a draft tree of N nodes (its accepted path, then first choices; double-click "
               "it for the tree)", "accepted drafts / drafted", "drafting time, ms",
               "target verification time, ms", "rollback (cache trim / tape replay; a tree round: the accepted path "
               "kept, its GatedDeltaNet steps replayed) time, ms",
               "seconds since the first token, at the end of the round")
BLOCK_COLUMN = 2
_SELECTED = QStyle.StateFlag.State_Selected.value
_RIGHT = int((Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter).value)
_ROLES = frozenset(int(r) for r in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole, ROUND_ROLE))


class RoundsModel(QAbstractTableModel):
    """Rows are the record's rounds; `refresh` announces the ones that arrived since last time."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.run: Optional[RunRecord] = None
        self._rows = 0

    @property
    def table(self):
        return self.run.table if self.run is not None else None

    def set_run(self, run: Optional[RunRecord]) -> None:
        self.beginResetModel()
        self.run = run
        self._rows = len(run.rounds) if run is not None else 0
        self.endResetModel()

    def refresh(self) -> int:
        """Insert rows for new rounds in one batch; returns how many."""
        if self.run is None:
            return 0
        n = len(self.run.rounds)
        added = n - self._rows
        if added > 0:
            self.beginInsertRows(QModelIndex(), self._rows, n - 1)
            self._rows = n
            self.endInsertRows()
        return max(added, 0)

    def round_at(self, row: int) -> Optional[RoundEvent]:
        return self.run.rounds[row] if self.run is not None and 0 <= row < self._rows else None

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else self._rows

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole:
            return HEADER_TIPS[section]
        return None

    @staticmethod
    def cell_text(r: RoundEvent, col: int) -> str:
        if col == 0:
            return str(r.index)
        if col == 1:
            return str(r.position)
        if col == 3:
            return f"{r.accepted}/{len(r.drafted)}"
        if col == 7:
            return f"{r.t:.3f}"
        return f"{(r.draft_ms, r.verify_ms, r.rollback_ms)[col - 4]:.2f}" if 4 <= col <= 6 else ""

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role not in _ROLES:  # the view asks for many roles per cell; answer the rest fast
            return None
        r = self.round_at(index.row())
        if r is None:
            return None
        col = index.column()
        if role == ROUND_ROLE:
            return r
        if role == Qt.ItemDataRole.DisplayRole:
            return None if col == BLOCK_COLUMN else self.cell_text(r, col)  # the block is painted
        if role == Qt.ItemDataRole.ToolTipRole:
            return round_tooltip(r, self.table)
        return None


def fit_chips(widths: list[int], avail: int, gap: int, marker_width) -> list[int]:
    """Which chips of a block to paint in `avail` pixels: all when they fit; else the anchor
    (first), the bonus or correction (last), and as many drafts from both ends as fit around one
    marker chip standing for the hidden middle, painted "…k" (k = how many it hides; -k here).

    Returns chip indices in order, with -k for the marker. The last chip always shows.
    """
    def width(items: list[int]) -> int:
        return sum(widths[i] if i >= 0 else marker_width(-i) for i in items) + gap * max(len(items) - 1, 0)

    n = len(widths)
    everything = list(range(n))
    if n <= 2 or width(everything) <= avail:
        return everything
    middle = list(range(1, n - 1))
    if width([0, -len(middle), n - 1]) > avail:  # too narrow even for that: the bonus goes first
        return [-(n - 1), n - 1] if width([-(n - 1), n - 1]) <= avail else [n - 1]
    head: list[int] = []
    tail: list[int] = []
    while middle:  # alternate: the next draft from the left, then the next one before the bonus
        take_head = len(head) <= len(tail)
        candidate = middle[0] if take_head else middle[-1]
        rest = len(middle) - 1
        trial = [0] + head + ([candidate] if take_head else []) + ([-rest] if rest else []) \
            + ([candidate] if not take_head else []) + tail + [n - 1]
        if width(trial) > avail:
            break
        if take_head:
            head.append(middle.pop(0))
        else:
            tail.insert(0, middle.pop())
    return [0] + head + ([-len(middle)] if middle else []) + tail + [n - 1]


class ChipDelegate(QStyledItemDelegate):
    """Paints every cell of a round row straight from the RoundEvent.

    The block column shows the anchor, the drafts (accepted prefix green, rejected struck
    through) and the bonus / correction as chips. It never calls `initStyleOption` (which
    asks the model for a dozen roles per cell) and batches painter state changes by chip
    style, so a row costs a few dozen painter calls.
    """

    PAD, GAP, MAX_CHARS = 4, 3, 10

    def __init__(self, parent=None):
        super().__init__(parent)
        self.font = theme.chip_font(8.5)
        self.strike = QFont(self.font)
        self.strike.setStrikeOut(True)
        self.metrics = QFontMetrics(self.font)
        self._widths: dict[tuple[int, int], tuple[str, int]] = {}  # (id(table), token) -> (text, width)
        pens = {k: QPen(QColor(c), 1) for k, c in (
            ("anchor", theme.CHIP_ANCHOR), ("accepted", theme.CHIP_ACCEPTED), ("rejected", theme.CHIP_REJECTED),
            ("bonus", theme.CHIP_BONUS), ("correction", theme.CHIP_CORRECTION))}
        self.styles = {  # style -> (outline pen, fill brush or None, text pen, font)
            "anchor": (pens["anchor"], None, QPen(QColor("#c3c8d0")), self.font),
            "accepted": (pens["accepted"], QColor(theme.CHIP_ACCEPTED), QPen(QColor("#ffffff")), self.font),
            "rejected": (pens["rejected"], QColor(theme.CHIP_REJECTED), QPen(QColor(theme.CHIP_REJECTED_TEXT)),
                         self.strike),
            "bonus": (pens["bonus"], QColor(theme.CHIP_BONUS), QPen(QColor("#ffffff")), self.font),
            "correction": (pens["correction"], QColor(theme.CHIP_CORRECTION), QPen(QColor("#ffffff")), self.font),
            "elided": (pens["anchor"], None, QPen(QColor("#8b93a1")), self.font),  # drafts hidden for width
            "plain": (pens["anchor"], None, QPen(QColor(theme.FOREGROUND)), self.font),  # auto's plain step
        }
        self.sources = {k: QColor(c) for k, c in theme.CHIP_SOURCE.items()}
        self.text_pen = QPen(QColor(theme.FOREGROUND))
        self.tree_pen = QPen(QColor(theme.CHIP_TREE), 1)
        self.selected = QColor("#3d5a80")
        self.alternate = QColor(theme.PANEL)

    def _chip(self, table, token: int) -> tuple[str, int]:
        key = (id(table), token)
        hit = self._widths.get(key)
        if hit is None:
            text = chip_text(table, token, self.MAX_CHARS)
            hit = self._widths[key] = (text, self.metrics.horizontalAdvance(text) + 2 * self.PAD)
        return hit

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index) -> None:
        # Plain ints, not Qt flag enums: enum arithmetic costs microseconds per cell in PySide6.
        model = index.model()
        row = index.row()
        r: Optional[RoundEvent] = model.round_at(row)
        rect = option.rect
        if option.state.value & _SELECTED:
            painter.fillRect(rect, self.selected)
        elif row & 1:
            painter.fillRect(rect, self.alternate)
        if r is None:
            return
        col = index.column()
        if col != BLOCK_COLUMN:
            painter.setPen(self.text_pen)
            painter.drawText(rect.adjusted(2, 0, -6, 0), _RIGHT, model.cell_text(r, col))
            return
        self._paint_block(painter, rect, r, model.table)

    def _paint_block(self, painter: QPainter, rect: QRect, r: RoundEvent, table) -> None:
        inner = rect.adjusted(3, 3, -3, -3)
        top, height = inner.top(), inner.height()
        tag = None  # a tree round: "tree N" (its draft nodes) before the anchor; the chips are its accepted line
        if is_tree_round(r):
            text = f"tree {len(r.tree_parents) - 1}"
            tag = (QRect(inner.left(), top, self.metrics.horizontalAdvance(text) + 2 * self.PAD, height), text)
            inner.setLeft(tag[0].right() + 1 + self.GAP)
        baseline = top + (height + self.metrics.ascent() - self.metrics.descent()) // 2
        styled = [("anchor", r.anchor)] + [("accepted" if k < r.accepted else "rejected", t)
                                            for k, t in enumerate(r.drafted)] + [(r.bonus_kind, r.bonus)]
        chips = [self._chip(table, token) for _, token in styled]
        # The anchor gets a little more air after it: count it into the anchor's width.
        widths = [w + (self.GAP if n == 0 else 0) for n, (_, w) in enumerate(chips)]
        shown = fit_chips(widths, inner.width(), self.GAP, lambda k: self._marker(k)[1])
        groups: dict[str, list[tuple[QRect, str]]] = {}
        edges: list[QRect] = []  # the drafted chips, whose left edge takes the source's colour
        x = inner.left()
        for i in shown:
            if i < 0:
                style, (text, w) = "elided", self._marker(-i)
            else:
                style, (text, w) = styled[i][0], chips[i]
            groups.setdefault(style, []).append((QRect(x, top, w, height), text))
            if 0 < i <= len(r.drafted):
                edges.append(QRect(x, top, 3, height))
            x += (widths[i] if i >= 0 else w) + self.GAP
        painter.save()
        painter.setClipRect(rect)
        if tag is not None:
            painter.setPen(self.tree_pen)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(tag[0], 4, 4)
            painter.setFont(self.font)
            painter.drawText(tag[0].left() + self.PAD, baseline, tag[1])
        for style, boxes in groups.items():
            outline, fill, text_pen, font = self.styles.get(style, self.styles["correction"])
            painter.setPen(outline)
            painter.setBrush(fill if fill is not None else Qt.BrushStyle.NoBrush)
            for chip, _text in boxes:
                painter.drawRoundedRect(chip, 4, 4)
            painter.setPen(text_pen)
            painter.setFont(font)
            for chip, text in boxes:
                painter.drawText(chip.left() + self.PAD, baseline, text)
        edge = self.sources.get(r.source) if r.source else None
        for chip in edges if edge is not None else ():
            painter.fillRect(chip, edge)
        painter.restore()

    def _marker(self, hidden: int) -> tuple[str, int]:
        text = f"…{hidden}"
        return text, self.metrics.horizontalAdvance(text) + 2 * self.PAD

    def sizeHint(self, option, index) -> QSize:  # noqa: N802
        return QSize(400, self.metrics.height() + 10)


class RoundsView(QTableView):
    """The table; emits `round_selected(index)` when the user picks a row, `round_opened(index)` when
    they double-click one."""

    round_selected = Signal(int)
    round_opened = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rounds_model = RoundsModel(self)
        self.setModel(self.rounds_model)
        self.chips = ChipDelegate(self)
        self.setItemDelegate(self.chips)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setAlternatingRowColors(True)
        self.setWordWrap(False)
        self.setShowGrid(False)
        vh = self.verticalHeader()
        vh.setVisible(False)
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)  # uniform rows: no per-row measuring
        vh.setDefaultSectionSize(self.chips.sizeHint(None, None).height())
        hh = self.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hh.setSectionResizeMode(BLOCK_COLUMN, QHeaderView.ResizeMode.Stretch)
        for col, width in enumerate((44, 48, 0, 46, 56, 58, 70, 56)):
            if col != BLOCK_COLUMN:
                self.setColumnWidth(col, width)
        self.selectionModel().currentRowChanged.connect(self._row_changed)
        self.doubleClicked.connect(lambda index: self.round_opened.emit(index.row()))  # Tree or Selector tab
        self._quiet = False

    def set_run(self, run: Optional[RunRecord]) -> None:
        self.rounds_model.set_run(run)

    def refresh(self) -> None:
        """Append new rounds; keep following the newest while the view sits at the bottom."""
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 2
        if self.rounds_model.refresh() and at_bottom:
            self.scrollToBottom()

    def show_start(self) -> None:
        """With no round picked, round 0 in view: the one the Selector describes (a run ended scrolled down)."""
        if not self.currentIndex().isValid():
            self.scrollToTop()

    def select_round(self, index: int) -> None:
        """Select a row without echoing `round_selected` (the output asked for it)."""
        if not 0 <= index < self.rounds_model.rowCount():
            return
        self._quiet = True
        try:
            self.selectRow(index)
            self.scrollTo(self.rounds_model.index(index, 0), QAbstractItemView.ScrollHint.PositionAtCenter)
        finally:
            self._quiet = False

    def focusInEvent(self, event) -> None:  # noqa: N802 (Qt makes the first row current: no user's pick)
        self._quiet = True
        super().focusInEvent(event)
        self._quiet = False

    def _row_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if not self._quiet and current.isValid():
            self.round_selected.emit(current.row())


def source_legend() -> QLabel:
    """The key to the drafted chips' left edges, shown under the rounds."""
    marks = " &nbsp;".join(f"<span style='color:{theme.CHIP_SOURCE[k]}'>▌</span>{label}"
                           for k, label in theme.SOURCE_LABEL.items())
    legend = QLabel(f"drafts from: {marks}")
    legend.setObjectName("hint")
    legend.setWordWrap(True)  # a narrow centre column takes it on two lines rather than widening
    return legend
