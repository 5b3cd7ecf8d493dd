"""Streamed output text, each token coloured by provenance, with per-token tooltips.

Tokens are inserted once, as their spans are aligned; Qt positions (UTF-16) are
tracked next to the record's Python string offsets so hover, click and
round highlighting map back to tokens exactly.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Optional

from PySide6.QtCore import QEvent, QPoint, Qt, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QTextEdit, QToolTip

from app import theme
from app.run_record import OutToken, RunRecord
from app.tokens import chip_text


def token_legend() -> QLabel:
    """The key to the output's colours, shown under the tabs."""
    legend = QLabel(
        "<span style='background:#245c3b'>&nbsp;accepted draft&nbsp;</span>&nbsp; "
        "<span style='background:#23508a'>&nbsp;bonus&nbsp;</span>&nbsp; "
        "<span style='background:#8a4f1c'>&nbsp;correction&nbsp;</span>&nbsp; "
        "plain: AR, auto's plain steps, prefill &nbsp;·&nbsp; hover a token for its round, block position and id; "
        "click it to find its round &nbsp;·&nbsp; round times below in ms")
    legend.setObjectName("hint")
    legend.setWordWrap(True)
    return legend


def _qt_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class OutputView(QPlainTextEdit):
    """Read-only; emits `token_clicked(token_index)`."""

    token_clicked = Signal(int)

    def __init__(self, parent=None, object_name: str = "output"):
        super().__init__(parent)
        self.setObjectName(object_name)
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.setMouseTracking(True)
        self.run: Optional[RunRecord] = None
        self._shown = 0  # spans rendered
        self._qt_starts: list[int] = []  # Qt position of each rendered span
        self._qt_end = 0
        self._token_qt: dict[int, tuple[int, int]] = {}
        self._round_selection: list[QTextEdit.ExtraSelection] = []
        self._marks: list[QTextEdit.ExtraSelection] = []
        self._formats = {}
        for kind, colour in theme.KIND_BACKGROUND.items():
            fmt = QTextCharFormat()
            if colour:
                fmt.setBackground(QColor(colour))
            self._formats[kind] = fmt
        self._plain = QTextCharFormat()

    # ---- content ----------------------------------------------------------------------------

    def set_run(self, run: Optional[RunRecord]) -> None:
        self.clear()
        self.run = run
        self._shown = 0
        self._qt_starts = []
        self._qt_end = 0
        self._token_qt = {}
        self._round_selection = []
        self._marks = []
        self.setExtraSelections([])
        self.refresh()

    def refresh(self) -> int:
        """Append spans aligned since the last call; returns how many."""
        run = self.run
        if run is None or self._shown >= len(run.spans):
            return 0
        bar = self.verticalScrollBar()
        follow = bar.value() >= bar.maximum() - 2
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.beginEditBlock()
        new = run.spans[self._shown:]
        for span in new:
            text = span.text
            fmt = self._formats.get(run.tokens[span.tokens[0]].kind, self._plain) if span.tokens else self._plain
            start = self._qt_end
            self._qt_starts.append(start)
            self._qt_end = start + _qt_len(text)
            for t in span.tokens:
                self._token_qt[t] = (start, self._qt_end)
            cursor.insertText(text, fmt)
        cursor.endEditBlock()
        self._shown += len(new)
        if follow:
            bar.setValue(bar.maximum())
        return len(new)

    def plain_text(self) -> str:
        return self.toPlainText()

    # ---- tokens under the mouse -------------------------------------------------------------

    def token_index_at_position(self, qt_pos: int) -> Optional[int]:
        """The token whose text holds document position `qt_pos`."""
        i = bisect.bisect_right(self._qt_starts, qt_pos) - 1
        if i < 0 or i >= self._shown or qt_pos >= self._qt_end or self.run is None:
            return None
        tokens = self.run.spans[i].tokens
        return tokens[0] if tokens else None

    def token_at(self, point: QPoint) -> Optional[OutToken]:
        """The token drawn at a viewport point."""
        cursor = self.cursorForPosition(point)
        pos = cursor.position()
        if point.x() < self.cursorRect(cursor).left() and pos > 0:
            pos -= 1  # the mouse is on the character left of the nearest cursor position
        index = self.token_index_at_position(pos)
        return self.run.tokens[index] if index is not None else None

    def token_span(self, token_index: int) -> Optional[tuple[int, int]]:
        """Qt document range of a token's text."""
        return self._token_qt.get(token_index)

    def tooltip_for(self, tok: OutToken) -> str:
        table = self.run.table if self.run is not None else None
        where = (f"round {tok.round}, block position {tok.block_pos}" if tok.round is not None
                 else ("prefill (before the first round)" if tok.kind == "prefill" else "AR step"))
        return (f"{theme.KIND_LABEL.get(tok.kind, tok.kind)}\n{where}\n"
                f"token {tok.index} · id {tok.id} · {chip_text(table, tok.id, 24)}")

    def viewportEvent(self, event: QEvent) -> bool:  # noqa: N802 (Qt API)
        if event.type() == QEvent.Type.ToolTip:
            tok = self.token_at(event.pos())
            if tok is not None:
                QToolTip.showText(event.globalPos(), self.tooltip_for(tok), self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802
        super().mouseReleaseEvent(event)
        if event.button() == Qt.MouseButton.LeftButton and not self.textCursor().hasSelection():
            tok = self.token_at(event.position().toPoint())
            if tok is not None:
                self.token_clicked.emit(tok.index)

    # ---- highlights -------------------------------------------------------------------------

    def _selection(self, start: int, end: int, background: str, foreground: Optional[str] = None):
        sel = QTextEdit.ExtraSelection()
        cursor = QTextCursor(self.document())
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        sel.cursor = cursor
        sel.format.setBackground(QColor(background))
        if foreground:
            sel.format.setForeground(QColor(foreground))
        return sel

    def highlight_tokens(self, token_indices: Iterable[int], scroll: bool = True) -> Optional[tuple[int, int]]:
        """Highlight a group of tokens (a round); returns the Qt range covered, or None."""
        ranges = [self._token_qt[t] for t in token_indices if t in self._token_qt]
        ranges = [r for r in ranges if r[1] > r[0]]
        self._round_selection = [self._selection(s, e, theme.ROUND_HIGHLIGHT, "#111111") for s, e in ranges]
        self._apply()
        if not ranges:
            return None
        lo, hi = min(s for s, _ in ranges), max(e for _, e in ranges)
        if scroll:
            cursor = QTextCursor(self.document())
            cursor.setPosition(lo)
            self.setTextCursor(cursor)
            self.ensureCursorVisible()
        return lo, hi

    def scroll_to_token(self, token_index: int) -> None:
        """Bring a token into view (the parity panes: both sides at their first difference)."""
        span = self._token_qt.get(token_index)
        if span is not None:
            cursor = QTextCursor(self.document())
            cursor.setPosition(span[0])
            self.setTextCursor(cursor)
            self.ensureCursorVisible()

    def highlight_round(self, round_index: int) -> Optional[tuple[int, int]]:
        if self.run is None:
            return None
        return self.highlight_tokens(self.run.round_tokens.get(round_index, []))

    def highlighted(self) -> list[tuple[int, int]]:
        return [(s.cursor.selectionStart(), s.cursor.selectionEnd()) for s in self._round_selection]

    def mark_tokens(self, token_indices: Iterable[int], underline_first: Optional[int] = None,
                    colour: str = theme.DIFF_MARK) -> None:
        """Mark tokens (parity differences) in `colour` (red: an error unless shown otherwise); the
        first divergence also underlined."""
        self.mark_colour = colour
        marks = []
        for t in token_indices:
            span = self._token_qt.get(t)
            if span and span[1] > span[0]:
                sel = self._selection(span[0], span[1], colour, "#ffffff")
                if t == underline_first:
                    sel.format.setUnderlineStyle(QTextCharFormat.UnderlineStyle.SingleUnderline)
                    sel.format.setProperty(QTextFormat.Property.FontWeight, 700)
                marks.append(sel)
        self._marks = marks
        self._apply()

    def marked(self) -> list[tuple[int, int]]:
        return [(s.cursor.selectionStart(), s.cursor.selectionEnd()) for s in self._marks]

    def _apply(self) -> None:
        self.setExtraSelections(self._marks + self._round_selection)
