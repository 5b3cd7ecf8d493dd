"""The window's menu bar: File (open, exports, quit) and Run (run, stop, load), with shortcuts."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMenu

from app.race_export import export_race_table


def _action(window: QMainWindow, menu: QMenu, text: str, slot: Callable, shortcuts: tuple[str, ...] = ()) -> QAction:
    a = QAction(text, window)
    if shortcuts:
        a.setShortcuts([QKeySequence(s) for s in shortcuts])
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    a.triggered.connect(slot)
    menu.addAction(a)
    return a


def build_menus(window) -> None:
    """Menus calling the window's own methods; sets window.run_action and window.stop_action."""
    m = window.menuBar().addMenu("&File")
    _action(window, m, "Open trace…", lambda: _ask_open_trace(window), ("Ctrl+O",))
    m.addSeparator()
    _action(window, m, "Export trace (JSONL)…",
            lambda: _ask_save(window, "trace", "JSONL (*.jsonl)", window.export_trace), ("Ctrl+S",))
    _action(window, m, "Export Chrome trace (JSON)…",
            lambda: _ask_save(window, "trace.chrome", "JSON (*.json)", window.export_chrome))
    _action(window, m, "Export rounds (CSV)…",
            lambda: _ask_save(window, "rounds", "CSV (*.csv)", window.export_rounds_csv))
    race = _action(window, m, "Export race table (CSV)…",
                   lambda: _ask_save(window, "race", "CSV (*.csv)", lambda path: export_race_table(window, path)))
    race.setEnabled(False)  # until a race has finished: the Save dialog before "nothing to export" wasted a step
    window.race_view.race_kept.connect(race.setEnabled)
    window.race_export_action = race
    _action(window, m, "Save plots (PNG)…", lambda: _ask_save(window, "plots", "PNG (*.png)", window.save_plots_png))
    m.addSeparator()
    _action(window, m, "Quit", window.close, ("Ctrl+Q",))
    r = window.menuBar().addMenu("&Run")
    window.run_action = _action(window, r, "Run", window.start_run, ("Ctrl+Return", "Ctrl+Enter"))
    window.stop_action = _action(window, r, "Stop", window.stop, ("Esc",))
    _action(window, r, "Load pair", window.start_load, ("Ctrl+L",))


def _ask_open_trace(window) -> None:
    path, _ = QFileDialog.getOpenFileName(window, "Open a trace", "", "Traces (*.jsonl);;All files (*)")
    if path:
        window.open_trace(path)


def suggested_path(stem: str, ext: str, mode: Optional[str], folder: Optional[Path],
                   now: Optional[datetime] = None) -> str:
    """What the save dialog offers: the kind of file, the run's mode and the time (so a second export
    does not offer to overwrite the first), in the folder saved to last, else the home folder (a
    double-clicked app's working folder is '/')."""
    when = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")  # seconds: two exports in a minute differ
    name = f"{stem.replace('.', '-')}-{mode or 'run'}-{when}{ext}"
    return str((folder if folder is not None and folder.is_dir() else Path.home()) / name)


def _ask_save(window, stem: str, filt: str, fn: Callable) -> None:
    ext = filt.split("*")[1].rstrip(")")
    start = suggested_path(stem, ext, window.controller.job_mode, getattr(window, "last_save_dir", None))
    path, _ = QFileDialog.getSaveFileName(window, "Save", start, filt)
    if path:
        window.last_save_dir = Path(path).parent
        fn(path)
