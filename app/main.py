"""`dflash-playground` (no command) and `dflash-playground gui`: open the window, or take a screenshot."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Optional


def _has_display() -> bool:
    if sys.platform != "linux":
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                or os.environ.get("QT_QPA_PLATFORM"))


def _qt_warning() -> Optional[str]:
    """PySide6 6.12.0 drops a reference to None on every Python override call (paintEvent, a
    delegate's paint) on Python < 3.12, where None is not immortal: the window then crashes
    after a few thousand repaints. 6.11 is fine."""
    import PySide6

    if PySide6.__version__.startswith("6.12.0") and sys.version_info < (3, 12):
        return (f"warning: PySide6 {PySide6.__version__} on Python {sys.version_info.major}."
                f"{sys.version_info.minor} has a reference-counting bug that crashes the window; "
                "install 'PySide6-Essentials<6.12' (or use Python 3.12+).")
    return None


def _demo_models(args: argparse.Namespace) -> Optional[tuple[str, Optional[str]]]:
    """--target/--drafter when given, else the installed demo pair, else None."""
    from engine.models.demo import demo_pair

    target = getattr(args, "target", None)
    if target:
        return target, getattr(args, "drafter", None)
    pair = demo_pair()
    return (str(pair[0]), str(pair[1])) if pair else None


def run_gui(args: argparse.Namespace) -> int:
    """Open the window; with --screenshot, render it (optionally after --run-demo), save a PNG and exit."""
    screenshot = getattr(args, "screenshot", None)
    run_demo = bool(getattr(args, "run_demo", False))
    models = _demo_models(args)
    if run_demo and models is None:
        print("error: --run-demo needs the demo pair, which is not installed yet; "
              "give --target and --drafter instead.", file=sys.stderr)
        return 2
    if run_demo and not screenshot:
        print("error: --run-demo goes with --screenshot FILE.png.", file=sys.stderr)
        return 2
    trace = getattr(args, "trace", None)
    if trace and run_demo:
        print("error: give a trace to open or --run-demo, not both.", file=sys.stderr)
        return 2
    if not _has_display():
        if not screenshot:
            print("error: no display found (DISPLAY is not set); set QT_QPA_PLATFORM=offscreen "
                  "to take screenshots, or run on a desktop.", file=sys.stderr)
            return 2
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from app.qt_libs import xcb_problem

    problem = xcb_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    from PySide6.QtWidgets import QApplication

    from app.logs import setup_logging
    from app.theme import apply_theme
    from app.window import MainWindow

    setup_logging()
    warning = _qt_warning()
    if warning:
        print(warning, file=sys.stderr)
        logging.getLogger("app").warning(warning)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("DFlash Playground")
    apply_theme(app)
    window = MainWindow(persist=not screenshot)
    from app.serve_view import add_serve_tab

    add_serve_tab(window)
    if models is not None and (run_demo or getattr(args, "target", None)):
        window.models.target.set_value(models[0])
        window.models.drafter.set_value(models[1] or "")
        window.models.check_now()
    from app.file_open import FileOpenFilter

    opener = FileOpenFilter(window)
    app.installEventFilter(opener)  # a trace opened from Finder
    window.show()
    # a trace, or a model folder (a file manager's %f); where it fails the window says why, and so does a screenshot
    if trace and not opener.open(trace) and screenshot:
        print(f"error: {window.errors[-1]}", file=sys.stderr)
        window.close()
        return 2
    if not screenshot:
        code = app.exec()
        if not getattr(window, "worker_stopped", True):
            # The worker is stuck in work that cannot be interrupted (reading weights): the settings
            # are saved, so leave now rather than let Qt abort on a running thread or wait on it.
            logging.getLogger("app").warning("leaving with the worker still running")
            os._exit(code)
        return code
    try:
        return _screenshot(app, window, Path(screenshot), run_demo, getattr(args, "max_tokens", None), trace,
                           bool(getattr(args, "tree_round", False)))
    finally:
        window.close()


def _screenshot(app, window, path: Path, run_demo: bool, max_tokens: Optional[int], trace: Optional[str],
                tree_round: bool = False) -> int:
    from engine.decode.settings import DEFAULTS
    from engine.errors import DFlashError
    from engine.safe_write import atomic_path, check_output

    try:  # before the demo run: a path that cannot be written costs nothing
        path = check_output(path, "the screenshot", inputs=(trace,))  # never over the trace it shows
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from PySide6.QtCore import QEventLoop
    from PySide6.QtGui import QGuiApplication

    from engine.models.demo import sample_prompt

    if QGuiApplication.platformName() == "offscreen":  # no real screen (800x800): the README's size
        window.resize(1600, 1000)
    # on a real display (a desktop, xvfb-run -s "-screen 0 1280x800x24") the size the screen gave it
    if run_demo:
        window.prompt.set_prompt(sample_prompt(window.models.target_value()))
        window.prompt.format.setCurrentIndex(window.prompt.format.findData("raw"))
        window.prompt.temperature.setValue(0.0)
        window.prompt.max_tokens.setValue(max_tokens or DEFAULTS.max_tokens)
        window.prompt.set_mode("both")
        if tree_round:
            window.prompt.tree_auto.setChecked(True)
        loop = QEventLoop()
        window.job_finished.connect(lambda _kind: loop.quit())
        errors_before = len(window.errors)
        window.start_run()
        if window.busy:
            loop.exec()
        if len(window.errors) > errors_before:
            print(f"error: {window.errors[-1]}", file=sys.stderr)
            return 2
        window.center_tabs.setCurrentIndex(0)
        if window.rounds_run is not None and window.rounds_run.rounds:
            middle = len(window.rounds_run.rounds) // 3
            window.rounds.selectRow(middle)
    if tree_round:
        _show_tree_round(window)
    for _ in range(5):
        app.processEvents()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: {path.parent}: cannot create the folder ({exc.strerror}).", file=sys.stderr)
        return 2
    try:
        with atomic_path(path, ".png") as tmp:
            if not window.grab().save(str(tmp), "PNG"):
                raise OSError("Qt could not save it")
    except OSError:
        print(f"error: {path}: cannot write the PNG.", file=sys.stderr)
        return 2
    print(f"saved {path}")
    return 0


def _show_tree_round(window) -> None:
    """The tree round that shows best what a tree is for, selected and drawn in the Tree tab."""
    from app.tree_view import telling_round

    run = window.rounds_run
    row = telling_round(run.rounds) if run is not None else None
    if row is None:
        print("note: the run verified no draft tree (auto chose the chain every round).", file=sys.stderr)
        return
    window.rounds.selectRow(row)
    window.rounds.scrollTo(window.rounds.rounds_model.index(row, 0))
    window.center_tabs.setCurrentWidget(window.tree_view)
