"""The main window: the view shell. Layout, menus, settings, model lists, files, dialogs.

Jobs, the worker's messages and the run records belong to the run controller
(app/run_controller.py); the window builds the views it updates and offers the few
view-level reactions it calls (a pair loaded or failed, parity shown, the status bar).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QMainWindow, QMessageBox, QSplitter, QTabWidget, QVBoxLayout, QWidget

from engine.decode.events import nothing_to_time
from engine.models.demo import demo_pair, prompt_after_load, sample_prompt
from engine.errors import DFlashError
from app import files, screen_fit
from app.jobs import PairInfo, ParityDone
from app.menus import build_menus
from app.autosave import Autosave
from app.file_open import pick_folder
from app.layout_fit import ColumnLayout, PlotsScroll, restore_splitters, settings_column, splitter_states
from app.models_panel import ModelsPanel
from app.output_view import OutputView, token_legend
from app.parity_view import ParityView, parity_mark
from app.plots import PlotsPanel
from app.progress_strip import ProgressStrip
from app.prompt_panel import PromptPanel
from app.race_view import RaceView
from app.round_links import RoundLinks
from app.rounds_view import RoundsView, source_legend
from app.selector_view import SelectorView
from app.model_lists import ModelLists
from app.run_controller import RunController
from app.run_record import RunRecord
from app.settings import AppSettings, load_settings, save_settings, settings_path
from app.status_line import MessageBar, StatusLine, trace_device
from app.tree_view import TreeView
from app.why_view import WhyView

log = logging.getLogger("app.window")


class MainWindow(QMainWindow):
    error_shown = Signal(str)
    notice_shown = Signal(str)

    def __init__(self, persist: bool = True, parent=None):
        super().__init__(parent)
        self.persist = persist
        self.settings_file = settings_path()  # saved back where it was read, whatever the env says later
        self.settings, notice = load_settings(self.settings_file, move_aside=persist)
        self.errors: list[str] = []
        self.notices: list[str] = []
        self.error_box: Optional[QMessageBox] = None
        self._closing = False

        self.setWindowTitle("DFlash Playground")
        self.setAcceptDrops(True)
        self.controller = RunController(self)  # starts the worker thread
        try:
            self._build()
            self.model_lists = ModelLists(self.models, self.settings, self)
            build_menus(self)
            self._apply_settings()
            self.autosave = Autosave(self.save_settings, self, enabled=persist)  # not only on close
            self.autosave.watch(self.main_split, self.center_split, self.center_tabs,
                                *self.prompt.findChildren(QWidget),  # its editor, boxes and buttons
                                *self.race_view.findChildren(QWidget))
            self.models.selection_changed.connect(self.autosave.changed)
        except BaseException:
            self.controller.shutdown()  # never leave a running QThread behind (Qt aborts the process)
            raise
        self.model_lists.start_scan()
        if notice:
            self.notify(notice, dialog=True)

    # ---- the controller's state, read by menus, exports and tests ---------------------------

    host = property(lambda self: self.controller.host)
    loaded = property(lambda self: self.controller.loaded)
    runs = property(lambda self: self.controller.runs)
    current_run = property(lambda self: self.controller.current_run)
    rounds_run = property(lambda self: self.controller.rounds_run)
    busy = property(lambda self: self.controller.busy)
    hf_scan_done = property(lambda self: self.model_lists.scan_done)
    job_finished = property(lambda self: self.controller.job_finished)
    run_finished = property(lambda self: self.controller.run_finished)
    load_finished = property(lambda self: self.controller.load_finished)

    # ---- layout ----------------------------------------------------------------------------

    def _build(self) -> None:
        self.models = ModelsPanel()
        self.prompt = PromptPanel()
        left = settings_column(self.models, self.prompt, self.prompt.run_bar)

        self.output, self.parity_view, self.why_view = OutputView(), ParityView(), WhyView()
        self.selector_view, self.race_view, self.center_tabs = SelectorView(), RaceView(), QTabWidget()
        self.tree_view = TreeView()  # after Race: a saved tab index still opens the tab it did
        for view, name in zip((self.output, self.parity_view, self.why_view, self.selector_view, self.race_view,
                               self.tree_view), ("Output", "Parity", "Why", "Selector", "Race", "Tree")):
            self.center_tabs.addTab(view, name)
        self.legend = token_legend()
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        self.progress = ProgressStrip()
        tl.addWidget(self.progress)
        tl.addWidget(self.center_tabs, 1)
        tl.addWidget(self.legend)
        self.rounds, self.rounds_legend = RoundsView(), source_legend()
        bottom = QWidget()
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(0, 0, 0, 0)
        bl.addWidget(self.rounds, 1)
        bl.addWidget(self.rounds_legend)
        self.center_split = QSplitter(Qt.Orientation.Vertical)
        self.center_split.addWidget(top)
        self.center_split.addWidget(bottom)

        self.plots = PlotsPanel()
        self.plots_page = PlotsScroll(self.plots)  # scrolls rather than squash the plots flat
        self.main_split = QSplitter(Qt.Orientation.Horizontal)
        self.main_split.addWidget(left)
        self.main_split.addWidget(self.center_split)
        self.main_split.addWidget(self.plots_page)
        self.main_split.setStretchFactor(1, 3)
        self.columns = ColumnLayout(self.main_split, left, self.center_tabs, self.plots_page, self.center_split)
        self.setCentralWidget(self.main_split)

        self.setStatusBar(MessageBar())
        self.status_line = StatusLine(self.statusBar())
        self.status_labels = self.status_line.labels
        self.update_status()
        self.models.load_requested.connect(self.start_load)
        self.models.cancel_requested.connect(self.stop)
        self.prompt.run_button.clicked.connect(self.start_run)
        self.prompt.notice.connect(self.notify)
        self.prompt.stop_button.clicked.connect(self.stop)
        self.round_links = RoundLinks(self)
        self.why_view.advise_requested.connect(self.controller.advise)
        self.race_view.race_requested.connect(self.start_race)
        self.race_view.stop_requested.connect(self.stop)
        self.race_view.method_selected.connect(self.controller.show_method)

    # ---- settings --------------------------------------------------------------------------

    def _apply_settings(self) -> None:
        s = self.settings
        demo = demo_pair()
        self.models.demo_installed = demo is not None
        self.model_lists.refresh()
        target, drafter = s.target, s.drafter
        if not target and demo is not None:  # first launch: the demo pair
            target, drafter = str(demo[0]), str(demo[1])
        self.models.target.set_value(target)
        self.models.drafter.set_value(drafter)
        self.prompt.apply(s)
        self.race_view.apply(s)
        self.prompt.set_prompt(sample_prompt(target) if s.prompt is None else s.prompt, undoable=False)
        screen_fit.place(self, s.window_geometry)  # fits the screen on a first launch, clamped after
        self.columns.fit(self.width(), self.height())  # sizes both splitters
        restore_splitters(s.splitters, self.columns.splits())
        self.center_tabs.setCurrentIndex(s.center_tab if 0 <= s.center_tab < self.center_tabs.count() else 0)
        self.models.check_now()

    def collect_settings(self) -> AppSettings:
        s = self.settings
        s.target = self.models.target_value()
        s.drafter = self.models.drafter_value() or ""
        self.prompt.store(s)
        self.race_view.store(s)
        s.window_geometry = bytes(self.saveGeometry().toBase64().data()).decode()
        s.splitters = {**s.splitters, **splitter_states(self.columns.splits())}  # the other arrangement's kept
        s.center_tab = self.center_tabs.currentIndex()
        return s

    def save_settings(self) -> None:
        problem = save_settings(self.collect_settings(), self.settings_file)
        if problem:
            log.warning(problem)

    # ---- jobs (run by the controller) -------------------------------------------------------

    def _chosen_target(self) -> Optional[str]:
        target = self.models.target_value()
        if not target:
            self.show_error("No target model", "choose a target model first (a folder or a Hugging Face id).")
        return target or None

    def start_load(self) -> None:
        if not self.busy and (target := self._chosen_target()):
            self.controller.start_load(target, self.models.drafter_value())

    def start_run(self) -> None:
        """Run the prompt with the current settings, loading the chosen pair first if it changed."""
        if not self.busy and (target := self._chosen_target()):
            self.controller.start_run(target, self.models.drafter_value())

    def start_race(self) -> None:
        """Race the ticked methods on the prompt (the Race tab), loading the chosen pair first if it changed."""
        r = self.race_view
        methods = r.methods()
        untimed = nothing_to_time(self.prompt.max_tokens.value(), "a race")  # as bench says it
        if untimed:
            self.show_error("Nothing to time", untimed)
        elif len(methods) < 2:
            self.show_error("Nothing to race", "tick a method besides AR (AR runs in every race, as the reference).")
        elif "draft-model" in methods and not r.draft_model_value():
            self.show_error("No draft model", "the draft-model method needs a draft model: a small model with the "
                            "target's tokenizer (a folder or a Hugging Face id); give one or untick it.")
        elif not self.busy and (target := self._chosen_target()):
            self.controller.start_race(target, self.models.drafter_value(), methods, r.draft_model_value(),
                                       r.num_draft.value())

    def stop(self) -> None:
        self.controller.stop()

    # ---- what the controller asks of the views ---------------------------------------------

    def clear_run_views(self) -> None:
        self.output.set_run(None)
        self.rounds.set_run(None)
        self.parity_view.clear()
        self.center_tabs.setTabText(1, "Parity")
        self.plots.clear_plots()
        self.why_view.clear()
        self.tree_view.clear()
        self.selector_view.clear()  # the race table stays: the last race's figures until the next race
        self.update_status()

    def pair_loaded(self, info: PairInfo) -> None:
        self.models.set_loading(False)
        facts = info.facts
        drafter = f" + {Path(info.drafter).name} ({facts.get('drafter_generation', 'DFlash')} drafter, " \
            f"{facts.get('drafter_layers')} layers, block {facts.get('block_size')})" if info.drafter \
            else " (no drafter: AR only)"
        self.models.status.setText(f"loaded: {Path(info.target).name}{drafter}; rollback {facts.get('rollback')}")
        self.prompt.set_capabilities(info.has_chat_template, info.has_thinking)
        for notice in (self.prompt.set_vocab_size(info.vocab_size), self.prompt.set_context(info.context)):
            if notice:  # a top-k past this vocabulary, max tokens past its context: cut
                self.notify(notice)
        self.status_line.show_device(info.device)
        self.settings.remember(info.target, info.drafter)
        self.autosave.changed()
        self.model_lists.refresh()
        self.prompt.set_prompt(prompt_after_load(self.prompt.prompt(), info.target))

    def pair_failed(self, message: str, cancelled: bool) -> None:
        self.models.set_loading(False)
        if cancelled:
            self.models.status.setText(message)
            self.notify(message)
        else:
            self.models.status.setText("no pair loaded")
            self.show_error("Could not load the pair", message)

    def show_parity(self, parity: Optional[ParityDone], ar: RunRecord, dflash: Optional[RunRecord]) -> None:
        self.parity_view.show_result(parity, ar, dflash)
        self.center_tabs.setTabText(1, f"Parity {parity_mark(parity, ar)}")

    def update_status(self) -> None:
        self.status_line.show_runs(self.runs, self.current_run, self.rounds_run)

    # ---- files -----------------------------------------------------------------------------

    def _export(self, what: str, fn, path: str | Path) -> bool:
        shown = self.controller.shown()  # a finished Both run: both runs and the verdict
        run = shown.dflash or shown.ar if isinstance(shown, files.Comparison) else shown
        if run is None or (not run.finished and self.busy):
            self.show_error("Nothing to export", "run a prompt (and let it finish) or open a trace first.")
            return False
        try:  # never over the trace on show: a Both run opened from it would lose what this export leaves out
            fn(shown, path, inputs=(self.controller.replaying,))
        except DFlashError as exc:
            self.show_error(f"Could not export the {what}", str(exc))
            return False
        self.statusBar().showMessage(f"saved the {what} to {path}" + (
            " (both runs and the parity verdict)" if isinstance(shown, files.Comparison) and what != "rounds" else ""))
        return True

    def export_trace(self, path: str | Path) -> bool:
        return self._export("trace", files.export_trace, path)

    def export_chrome(self, path: str | Path) -> bool:
        return self._export("Chrome trace", files.export_chrome, path)

    def export_rounds_csv(self, path: str | Path) -> bool:
        return self._export("rounds", files.export_rounds_csv, path)

    def save_plots_png(self, path: str | Path) -> bool:
        if not self.plots.save_png(path):
            self.show_error("Could not save the plots", f"{path}: cannot write a PNG there.")
            return False
        self.statusBar().showMessage(f"saved the plots to {path}")
        return True

    def open_trace(self, path: str | Path) -> bool:
        """Replay a saved trace: rounds, plots and output, with no model loaded."""
        if self.busy:
            self.show_error("Busy", "stop the current run before opening a trace.")
            return False
        try:
            opened = files.open_trace(path)
        except DFlashError as exc:
            self.show_error("Could not open the trace", str(exc))
            return False
        self.controller.show_replay(opened, Path(path))
        run, elsewhere = self.controller.current_run, None
        if run.header is not None:
            self.prompt.apply_trace_header(run.header, run.table)
            if isinstance(opened, files.Comparison):  # Run checks the same prompt again, on the same pair
                self.prompt.set_mode("both")
            elsewhere = self.models.choose_pair_of(run.header)
            device = trace_device(run.header)
            if device is not None:
                self.status_line.show_device(device)
        self.center_tabs.setCurrentWidget(self.parity_view if isinstance(opened, files.Comparison) else self.output)
        missing = " ".join(m for m in (files.unfinished(opened, path), elsewhere) if m)
        if missing:
            self.notify(missing, dialog=True)  # its totals are missing: a status-bar line is cut at laptop widths
        else:
            self.statusBar().showMessage(f"replaying {path}")
        return True

    # ---- drag and drop ---------------------------------------------------------------------

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt API)
        if any(Path(u.toLocalFile()).is_dir() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        for url in event.mimeData().urls():
            if Path(url.toLocalFile()).is_dir():
                pick_folder(self, url.toLocalFile(), "drop")
        event.acceptProposedAction()

    # ---- messages --------------------------------------------------------------------------

    def show_error(self, title: str, message: str) -> None:
        """A non-modal dialog with the engine's sentence; the window stays usable behind it."""
        log.info("error shown: %s", message)
        self.errors.append(message)
        if self.error_box is not None:
            self.error_box.close()
        box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self)
        box.setWindowModality(Qt.WindowModality.NonModal)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.show()
        self.error_box = box
        self.statusBar().showMessage(message, 10000)
        self.error_shown.emit(message)

    def notify(self, message: str, dialog: bool = False) -> None:
        """An inline notice in the status bar (and a non-modal box when it must be seen)."""
        self.notices.append(message)
        self.statusBar().showMessage(message, 15000)
        if dialog:
            box = QMessageBox(QMessageBox.Icon.Information, "DFlash Playground", message,
                              QMessageBox.StandardButton.Ok, self)
            box.setWindowModality(Qt.WindowModality.NonModal)
            box.show()
            self.notice_box = box
        self.notice_shown.emit(message)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self.columns.fit(self.width(), self.height())

    # ---- closing ---------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        """Cancel any run or load, wait for the worker to let go of MLX, then close."""
        if self._closing:
            event.accept()
            return
        self._closing = True
        self.autosave.stop()
        if self.persist:
            self.save_settings()
        self.hide()
        self.worker_stopped = self.controller.shutdown()  # False: stuck past its bound (app/main.py exits)
        for box in (self.error_box, getattr(self, "notice_box", None)):
            if box is not None:
                box.close()
        event.accept()
