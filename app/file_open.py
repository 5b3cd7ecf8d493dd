"""Files handed to the running app by the desktop: a trace opened from Finder.

macOS gives a file opened with the app (a double-click on a trace associated with it, Open With, a
drop on its Dock icon) to the running program as a QFileOpenEvent, not as an argument; Linux file
managers pass it as an argument (the desktop entry's `gui %f`), which `gui TRACE.jsonl` takes.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QObject


def pick_folder(window, folder: str, how: str) -> bool:
    """A folder handed to the window (dropped on it, opened from the desktop) into the picker its config
    names; False, and said, when it holds no model."""
    if window.models.accept_folder(folder) is not None:
        return True
    window.show_error("Not a model folder", f"{folder}: no readable config.json; {how} a model folder.")
    return False


class FileOpenFilter(QObject):
    """On the QApplication: a trace is opened as File > Open trace opens it, a model folder goes to the
    picker its config names (as a folder dropped on the window does)."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window

    def open(self, path: str) -> bool:
        """Open what the desktop handed over; False (the window said why) when it could not."""
        if Path(path).is_dir():
            return pick_folder(self.window, path, "open")
        return self.window.open_trace(path)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt API)
        if event.type() != QEvent.Type.FileOpen:
            return False
        if event.file():
            self.open(event.file())
        return True
