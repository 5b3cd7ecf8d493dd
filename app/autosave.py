"""Save the settings shortly after they change, not only when the window closes, so a crash
(or a killed process) loses at most the last second of typing.

Every control that feeds AppSettings restarts one single-shot timer; when it fires, the window
collects and writes the settings (atomically, engine/safe_write.py). A burst of keystrokes is
one write. Closing the window stops the timer: closeEvent writes them itself.
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import (
    QAbstractButton, QAbstractSpinBox, QComboBox, QLineEdit, QPlainTextEdit, QSplitter, QTabWidget,
)

DELAY_MS = 1000


class Autosave(QObject):
    """`save` once `delay_ms` passed without a change; never when not `enabled` (a screenshot's window)."""

    def __init__(self, save: Callable[[], None], parent: QObject, enabled: bool = True, delay_ms: int = DELAY_MS):
        super().__init__(parent)
        self.enabled = enabled
        self.timer = QTimer(self, singleShot=True, interval=delay_ms)
        self.timer.timeout.connect(save)

    def changed(self, *_args) -> None:
        """Something the settings hold changed: (re)start the countdown."""
        if self.enabled:
            self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def watch(self, *widgets: QObject) -> None:
        """Restart the timer on each widget's change signal; widgets without one are skipped
        (so a panel's findChildren() can be passed whole)."""
        for w in widgets:
            signal = _change_signal(w)
            if signal is not None:
                signal.connect(self.changed)


def _change_signal(w: QObject):
    if isinstance(w, (QPlainTextEdit, QLineEdit)):
        return w.textChanged
    if isinstance(w, QComboBox):
        return w.currentIndexChanged if not w.isEditable() else w.currentTextChanged
    if isinstance(w, QAbstractSpinBox) and hasattr(w, "valueChanged"):
        return w.valueChanged
    if isinstance(w, QAbstractButton) and w.isCheckable():
        return w.toggled
    if isinstance(w, QSplitter):
        return w.splitterMoved
    if isinstance(w, QTabWidget):
        return w.currentChanged
    return None
