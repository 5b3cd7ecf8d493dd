"""The main window: wires the panels to the worker and turns its messages into views.

The worker puts messages on a queue. The window drains it when a refresh is due
(a single-shot timer paced by `Throttle`, so watching costs the GUI thread ~1.5% of
a core) and at once when the worker signals that a job ended; draining updates the run
records (plain Python), then the views repaint from them.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QByteArray, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog, QLabel, QMainWindow, QMessageBox, QSplitter, QTabWidget, QVBoxLayout, QWidget,
)

from engine.demo_models import SAMPLE_PROMPT, demo_pair
from engine.errors import DFlashError
from engine.events import StartEvent
from engine.generate import CancelToken
from app import catalog, files
from app.catalog import DRAFTER, TARGET
from app.jobs import (
    EngineEvent, JobDone, LoadFailed, Loaded, LoadJob, LoadProgress, PairInfo, ParityDone,
    RunFailed, RunJob,
)
from app.models_panel import ModelsPanel
from app.output_view import OutputView
from app.parity_view import ParityView
from app.plots import PlotsPanel
from app.prompt_panel import PromptPanel
from app.rounds_view import RoundsView
from app.run_record import RunRecord
from app.settings import AppSettings, load_settings, save_settings, settings_path
from app.throttle import Throttle
from app.worker import WorkerHost

log = logging.getLogger("app.window")

FIRST_REFRESH_MS = 50  # after Run: soon enough to show the first tokens
REFRESH_MIN_S = 0.1  # views refresh at most this often...
REFRESH_BUDGET = 0.015  # ...and slower when the GUI thread would use more than 1.5% of wall time
PLOT_MIN_S = 1.0  # plots (the costliest repaint) at most this often, and every other refresh


class MainWindow(QMainWindow):
    # Emitted after the drain that handled the worker's JobDone, so views already hold everything.
    job_finished = Signal(str)
    run_finished = Signal()
    load_finished = Signal(bool)
    error_shown = Signal(str)
    notice_shown = Signal(str)
    _hf_scanned = Signal(object)

    def __init__(self, persist: bool = True, parent=None):
        super().__init__(parent)
        self.persist = persist
        self.settings_file = settings_path()  # saved back where it was read, whatever the env says later
        self.settings, notice = load_settings(self.settings_file)
        self.host = WorkerHost(self)
        self.loaded: Optional[PairInfo] = None
        self.runs: dict[str, RunRecord] = {}
        self.current_run: Optional[RunRecord] = None  # shown in Output
        self.rounds_run: Optional[RunRecord] = None  # shown in Rounds and the round plots
        self.parity: Optional[ParityDone] = None
        self.replaying: Optional[Path] = None
        self.job_mode: Optional[str] = None  # mode of the last run submitted
        self.active: Optional[tuple[int, Any]] = None  # (job id, job) of the job the user is waiting on
        self.errors: list[str] = []
        self.notices: list[str] = []
        self.error_box: Optional[QMessageBox] = None
        self._hf_entries: list[catalog.ModelEntry] = []
        self._closing = False
        self._throttle = Throttle(REFRESH_MIN_S, REFRESH_BUDGET)
        self._last_plot = 0.0
        self._dirty = False

        self.setWindowTitle("DFlash Playground")
        self.setAcceptDrops(True)
        self._build()
        self._build_menus()
        self._apply_settings()
        self.timer = QTimer(self, singleShot=True)
        self.timer.timeout.connect(self._tick)
        self.host.worker.job_done.connect(self._tick)  # queued: the last events, without waiting
        self._hf_scanned.connect(self._on_hf_scanned)
        self._start_hf_scan()
        if notice:
            self.notify(notice, dialog=True)

    # ---- layout ----------------------------------------------------------------------------

    def _build(self) -> None:
        self.models = ModelsPanel()
        self.prompt = PromptPanel()
        left = QWidget()
        lay = QVBoxLayout(left)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.models)
        lay.addWidget(self.prompt, 1)
        left.setMinimumWidth(330)

        self.output = OutputView()
        self.parity_view = ParityView()
        self.center_tabs = QTabWidget()
        self.center_tabs.addTab(self.output, "Output")
        self.center_tabs.addTab(self.parity_view, "Parity")
        self.legend = QLabel(
            "<span style='background:#245c3b'>&nbsp;accepted draft&nbsp;</span>&nbsp; "
            "<span style='background:#23508a'>&nbsp;bonus&nbsp;</span>&nbsp; "
            "<span style='background:#8a4f1c'>&nbsp;correction&nbsp;</span>&nbsp; "
            "plain: AR / prefill &nbsp;·&nbsp; hover a token for its round, block position and id; "
            "click it to find its round &nbsp;·&nbsp; round times below in ms")
        self.legend.setObjectName("hint")
        self.legend.setWordWrap(True)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.center_tabs, 1)
        tl.addWidget(self.legend)
        self.rounds = RoundsView()
        self.center_split = QSplitter(Qt.Orientation.Vertical)
        self.center_split.addWidget(top)
        self.center_split.addWidget(self.rounds)
        self.center_split.setSizes([420, 480])

        self.plots = PlotsPanel()
        self.main_split = QSplitter(Qt.Orientation.Horizontal)
        self.main_split.addWidget(left)
        self.main_split.addWidget(self.center_split)
        self.main_split.addWidget(self.plots)
        self.main_split.setStretchFactor(1, 3)
        self.main_split.setStretchFactor(2, 2)
        self.main_split.setSizes([360, 700, 540])
        self.setCentralWidget(self.main_split)

        bar = self.statusBar()
        self.status_labels = {}
        for key in ("tok/s", "tau", "rounds", "tokens", "device", "peak"):
            label = QLabel(f"{key}: –")
            bar.addPermanentWidget(label)
            self.status_labels[key] = label

        self._update_status()
        self.models.load_requested.connect(self.start_load)
        self.models.cancel_requested.connect(self.stop)
        self.prompt.run_button.clicked.connect(self.start_run)
        self.prompt.stop_button.clicked.connect(self.stop)
        self.rounds.round_selected.connect(self._round_selected)
        self.output.token_clicked.connect(self._token_clicked)

    def _build_menus(self) -> None:
        def action(menu, text, slot, shortcuts=()):
            a = QAction(text, self)
            if shortcuts:
                a.setShortcuts([QKeySequence(s) for s in shortcuts])
                a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            a.triggered.connect(slot)
            menu.addAction(a)
            return a

        m = self.menuBar().addMenu("&File")
        action(m, "Open trace…", self._ask_open_trace, ["Ctrl+O"])
        m.addSeparator()
        action(m, "Export trace (JSONL)…", lambda: self._ask_save("trace", "JSONL (*.jsonl)", self.export_trace),
               ["Ctrl+S"])
        action(m, "Export Chrome trace (JSON)…",
               lambda: self._ask_save("trace.chrome", "JSON (*.json)", self.export_chrome))
        action(m, "Export rounds (CSV)…", lambda: self._ask_save("rounds", "CSV (*.csv)", self.export_rounds_csv))
        action(m, "Save plots (PNG)…", lambda: self._ask_save("plots", "PNG (*.png)", self.save_plots_png))
        m.addSeparator()
        action(m, "Quit", self.close, ["Ctrl+Q"])
        r = self.menuBar().addMenu("&Run")
        self.run_action = action(r, "Run", self.start_run, ["Ctrl+Return", "Ctrl+Enter"])
        self.stop_action = action(r, "Stop", self.stop, ["Esc"])
        action(r, "Load pair", self.start_load, ["Ctrl+L"])

    # ---- settings --------------------------------------------------------------------------

    def _apply_settings(self) -> None:
        s = self.settings
        demo = demo_pair()
        self.models.demo_installed = demo is not None
        self._refresh_entries()
        target, drafter = s.target, s.drafter
        if not target and demo is not None:  # first launch: the demo pair
            target, drafter = str(demo[0]), str(demo[1])
        self.models.target.set_value(target)
        self.models.drafter.set_value(drafter)
        self.prompt.apply(s)
        self.prompt.set_prompt(SAMPLE_PROMPT if s.prompt is None else s.prompt)
        if s.window_geometry:
            self.restoreGeometry(QByteArray.fromBase64(s.window_geometry.encode()))
        else:
            self.resize(1600, 1000)
        for name, split in (("main", self.main_split), ("center", self.center_split)):
            state = s.splitters.get(name)
            if isinstance(state, str) and state:
                split.restoreState(QByteArray.fromBase64(state.encode()))
        self.center_tabs.setCurrentIndex(s.center_tab if 0 <= s.center_tab < self.center_tabs.count() else 0)
        self.models.check_now()

    def collect_settings(self) -> AppSettings:
        s = self.settings
        s.target = self.models.target_value()
        s.drafter = self.models.drafter_value() or ""
        self.prompt.store(s)
        s.window_geometry = bytes(self.saveGeometry().toBase64().data()).decode()
        s.splitters = {name: bytes(split.saveState().toBase64().data()).decode()
                       for name, split in (("main", self.main_split), ("center", self.center_split))}
        s.center_tab = self.center_tabs.currentIndex()
        return s

    def save_settings(self) -> None:
        problem = save_settings(self.collect_settings(), self.settings_file)
        if problem:
            log.warning(problem)

    # ---- model lists -----------------------------------------------------------------------

    def _refresh_entries(self) -> None:
        s = self.settings
        demo = catalog.demo_entries()
        groups = {role: catalog.merge_entries(
            [e for e in demo if e.role == role],
            catalog.recent_entries(s.recent_targets if role == TARGET else s.recent_drafters, role),
            [e for e in self._hf_entries if e.role == role],
        ) for role in (TARGET, DRAFTER)}
        self.models.set_entries(groups[TARGET], groups[DRAFTER])

    def _start_hf_scan(self) -> None:
        def scan() -> None:
            try:
                entries = catalog.scan_hf_cache()
            except Exception:  # noqa: BLE001 - a broken cache just lists nothing
                log.exception("scanning the Hugging Face cache failed")
                entries = []
            try:
                self._hf_scanned.emit(entries)
            except RuntimeError:  # the window is gone
                pass

        self._scan_thread = threading.Thread(target=scan, name="hf-cache-scan", daemon=True)
        self._scan_thread.start()

    def _on_hf_scanned(self, entries: list) -> None:
        self._hf_entries = entries
        self._refresh_entries()
        self.hf_scan_done = True

    # ---- jobs ------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.active is not None

    def _submit(self, job: Any) -> None:
        job_id = self.host.submit(job)
        self.active = (job_id, job)
        self.prompt.set_running(True)
        self.models.load_button.setEnabled(False)
        self._last_plot = time.perf_counter()  # nothing to plot yet: the first refresh skips the plots
        self.timer.start(FIRST_REFRESH_MS)

    def start_load(self) -> None:
        if self.busy:
            return
        target = self.models.target_value()
        if not target:
            self.show_error("No target model", "choose a target model first (a folder or a Hugging Face id).")
            return
        job = LoadJob(target, self.models.drafter_value())
        self.models.set_loading(True)
        self.models.status.setText("loading…")
        self._submit(job)

    def start_run(self) -> None:
        """Run the prompt with the current settings, loading the chosen pair first if it changed."""
        if self.busy:
            return
        target, drafter = self.models.target_value(), self.models.drafter_value()
        if not target:
            self.show_error("No target model", "choose a target model first (a folder or a Hugging Face id).")
            return
        cancel = CancelToken()
        load = None
        if self.loaded is None or (self.loaded.target, self.loaded.drafter) != (target, drafter):
            load = LoadJob(target, drafter, cancel=cancel)
            self.models.set_loading(True)
        job = RunJob(self.prompt.prompt(), self.prompt.chat_flag(), self.prompt.thinking_flag(), self.prompt.mode(),
                     self.prompt.settings(), load=load, cancel=cancel)
        self._clear_run_views()
        self.job_mode = job.mode
        self.statusBar().showMessage("running…")
        self._submit(job)

    def stop(self) -> None:
        """Cancel the job in progress: a run stops within one round, a load between stages."""
        if self.active is not None:
            self.active[1].cancel.cancel()
            self.statusBar().showMessage("stopping…")

    def _clear_run_views(self) -> None:
        self.runs = {}
        self.current_run = None
        self.rounds_run = None
        self.parity = None
        self.replaying = None
        self.output.set_run(None)
        self.rounds.set_run(None)
        self.parity_view.clear()
        self.center_tabs.setTabText(1, "Parity")
        self.plots.clear_plots()
        self._update_status()

    # ---- draining the worker ---------------------------------------------------------------

    def _tick(self) -> None:
        """Drain the worker's queue, refresh the views, and schedule the next refresh."""
        done = []
        for msg in self.host.take():
            if isinstance(msg, JobDone):
                done.append(msg)
            else:
                self._handle(msg)
        if done or (self._dirty and self._throttle.due()):
            self._refresh_views(final=bool(done))
        for msg in done:
            self._job_done(msg)
        if self.host.busy or self._dirty:  # poll no faster than FIRST_REFRESH_MS while waiting
            wait = max(self._throttle.next_at - time.perf_counter(), FIRST_REFRESH_MS / 1000)
            self.timer.start(int(wait * 1000))
        else:
            self.timer.stop()

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, EngineEvent):
            if isinstance(msg.event, StartEvent):
                table = self.loaded.token_table if self.loaded else None
                run = RunRecord(msg.event, msg.header, table)
                self.runs[msg.label] = run
                self.current_run = run
                self.output.set_run(run)
                if msg.label == "dflash":
                    self.rounds_run = run
                    self.rounds.set_run(run)
            else:
                run = self.runs.get(msg.label)
                if run is not None:
                    run.add(msg.event)
            self._dirty = True
        elif isinstance(msg, LoadProgress):
            self.models.set_progress(msg.stage, msg.frac)
        elif isinstance(msg, Loaded):
            self._loaded(msg.info)
        elif isinstance(msg, LoadFailed):
            self.loaded = None  # the worker let go of the old pair before trying the new one
            self.models.set_loading(False)
            if msg.cancelled:
                self.models.status.setText(msg.message)
                self.notify(msg.message)
            else:
                self.models.status.setText("no pair loaded")
                self.show_error("Could not load the pair", msg.message)
        elif isinstance(msg, ParityDone):
            self.parity = msg
            self._dirty = True
        elif isinstance(msg, RunFailed):
            self.show_error("The run failed", msg.message)

    def _loaded(self, info: PairInfo) -> None:
        self.loaded = info
        self.models.set_loading(False)
        facts = info.facts
        drafter = f" + drafter ({facts.get('drafter_layers')} layers, block {facts.get('block_size')})" \
            if info.drafter else " (no drafter: AR only)"
        self.models.status.setText(f"loaded: {Path(info.target).name}{drafter}; rollback {facts.get('rollback')}")
        self.prompt.set_capabilities(info.has_chat_template, info.has_thinking)
        self.status_labels["device"].setText(f"device: {info.device}")
        self.settings.remember(info.target, info.drafter)
        self._refresh_entries()

    def _refresh_views(self, final: bool = False) -> None:
        self._throttle.started()
        self.output.refresh()
        self.rounds.refresh()
        if self.job_mode == "both":
            self.parity_view.show_runs(self.runs.get("ar"), self.runs.get("dflash"))
        self._update_status()
        now = time.perf_counter()
        if final or now - self._last_plot >= max(PLOT_MIN_S, 2 * self._throttle.last_gap):
            self._last_plot = now
            self.plots.update_runs(self.runs, self.rounds_run)
            self._dirty = False
        if final:
            self._dirty = False
            if self.parity is not None and "ar" in self.runs and "dflash" in self.runs:
                self.parity_view.show_result(self.parity, self.runs["ar"], self.runs["dflash"])
                mark = "✓" if self.parity.identical else "✗"
                self.center_tabs.setTabText(1, f"Parity {mark}")

    def _update_status(self) -> None:
        run = self.rounds_run or self.current_run
        labels = self.status_labels
        if run is None:
            for key, name in (("tok/s", "tok/s"), ("tau", "τ"), ("rounds", "rounds"), ("tokens", "tokens"),
                              ("peak", "peak")):
                labels[key].setText(f"{name}: –")
            return
        shown = self.current_run or run
        ar, df = self.runs.get("ar"), self.runs.get("dflash")
        if ar is not None and df is not None and ar.tok_per_s and df.tok_per_s:
            labels["tok/s"].setText(f"tok/s: AR {ar.tok_per_s:.1f} · DFlash {df.tok_per_s:.1f} "
                                    f"(×{df.tok_per_s / ar.tok_per_s:.2f})")
        else:
            tps = shown.tok_per_s
            labels["tok/s"].setText(f"{shown.mode} tok/s: {tps:.1f}" if tps is not None else "tok/s: –")
        tau = run.tau
        labels["tau"].setText(f"τ: {tau:.2f}" if tau is not None else "τ: –")
        labels["rounds"].setText(f"rounds: {len(run.rounds)}")
        labels["tokens"].setText(f"tokens: {len(shown.tokens)}")
        peak = shown.summary.peak_memory_mb if shown.summary else None
        labels["peak"].setText(f"peak: {peak:.0f} MB" if peak is not None else "peak: –")

    def _job_done(self, msg: JobDone) -> None:
        if self.active is not None and self.active[0] == msg.job_id:
            self.active = None
        self.prompt.set_running(False)
        self.models.set_loading(False)
        self.models.load_button.setEnabled(True)
        if msg.kind == "run":
            run = self.current_run
            if run is not None and run.summary is not None:
                s = run.summary
                self.statusBar().showMessage(
                    f"{s.mode}: {s.num_generated} tokens, {s.tok_per_s:.1f} tok/s, stop: {s.stop_reason}")
            elif msg.cancelled:
                self.statusBar().showMessage("stopped")
            self.job_finished.emit(msg.kind)
            self.run_finished.emit()
        elif msg.kind == "load":
            self.job_finished.emit(msg.kind)
            self.load_finished.emit(msg.ok)

    # ---- rounds <-> output -----------------------------------------------------------------

    def _round_selected(self, index: int) -> None:
        self.center_tabs.setCurrentWidget(self.output)
        self.output.highlight_round(index)

    def _token_clicked(self, token_index: int) -> None:
        run = self.output.run
        if run is None or run is not self.rounds_run:
            return
        tok = run.tokens[token_index]
        if tok.round is not None:
            self.rounds.select_round(tok.round)
            self.output.highlight_round(tok.round)

    # ---- files -----------------------------------------------------------------------------

    def primary_run(self) -> Optional[RunRecord]:
        """What exports write: the DFlash run when there is one (in Both mode too), else the last run."""
        return self.runs.get("dflash") or self.current_run

    def _export(self, what: str, fn, path: str | Path) -> bool:
        run = self.primary_run()
        if run is None or (not run.finished and self.busy):
            self.show_error("Nothing to export", "run a prompt (and let it finish) or open a trace first.")
            return False
        try:
            fn(run, path)
        except DFlashError as exc:
            self.show_error(f"Could not export the {what}", str(exc))
            return False
        self.statusBar().showMessage(f"saved the {what} to {path}")
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
            run = files.open_trace(path)
        except DFlashError as exc:
            self.show_error("Could not open the trace", str(exc))
            return False
        self._clear_run_views()
        self.job_mode = None
        self.replaying = Path(path)
        self.runs = {run.mode: run}
        self.current_run = run
        self.rounds_run = run if run.rounds else None
        self.output.set_run(run)
        self.rounds.set_run(self.rounds_run)
        self.plots.update_runs(self.runs, self.rounds_run)
        self._update_status()
        self.center_tabs.setCurrentWidget(self.output)
        self.statusBar().showMessage(f"replaying {path}")
        return True

    def _ask_open_trace(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a trace", "", "Traces (*.jsonl);;All files (*)")
        if path:
            self.open_trace(path)

    def _ask_save(self, stem: str, filt: str, fn) -> None:
        ext = filt.split("*")[1].rstrip(")")
        path, _ = QFileDialog.getSaveFileName(self, "Save", f"{stem}{ext}", filt)
        if path:
            fn(path)

    # ---- drag and drop ---------------------------------------------------------------------

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt API)
        if any(Path(u.toLocalFile()).is_dir() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        for url in event.mimeData().urls():
            folder = url.toLocalFile()
            if not Path(folder).is_dir():
                continue
            if self.models.accept_folder(folder) is None:
                self.show_error("Not a model folder", f"{folder}: no readable config.json; drop a model folder.")
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

    # ---- closing ---------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        """Cancel any run or load, wait for the worker to let go of MLX, then close."""
        if self._closing:
            event.accept()
            return
        self._closing = True
        if self.persist:
            self.save_settings()
        self.timer.stop()
        self.hide()
        self.host.shutdown()
        self.host.take()
        for box in (self.error_box, getattr(self, "notice_box", None)):
            if box is not None:
                box.close()
        event.accept()
