"""A strip above the centre tabs for long work inside a run (the cost curve's first measurement): what
is measured, a progress bar and the time left, where the status bar's one line was cut at laptop widths."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QWidget


class ProgressStrip(QWidget):
    """Hidden until `show_progress`; `finish` hides it again. `shown` carries each state as one line."""

    shown = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.label = QLabel()
        self.label.setWordWrap(True)  # a narrow centre column takes it on two lines rather than cut it
        self.label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.bar = QProgressBar()
        self.bar.setFixedWidth(160)
        self.left = QLabel()
        self.left.setObjectName("hint")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(4, 2, 4, 2)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.bar)
        lay.addWidget(self.left)
        self.setVisible(False)

    def show_progress(self, what: str, done: int, total: int, left_s: Optional[float]) -> None:
        """`what` is being measured, `done` of `total` steps; `left_s` seconds to go (None: not known yet)."""
        self.label.setText(what)
        self.label.setToolTip(what)
        self.bar.setRange(0, max(total, 1))
        self.bar.setValue(min(done, total))
        self.bar.setFormat(f"{done}/{total}")
        self.left.setText(f"about {left_s:.0f} s left · Esc stops" if left_s is not None else "Esc stops")
        self.setVisible(True)
        self.shown.emit(f"{what}: {self.bar.text()}, {self.left.text()}")

    def finish(self) -> None:
        self.setVisible(False)
