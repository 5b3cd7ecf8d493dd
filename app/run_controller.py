"""The run controller: submits jobs to the worker, drains its messages, and dispatches them by type.

The worker puts messages on a queue. The controller drains it when a refresh is due
(a single-shot timer paced by `Throttle`, so watching costs the GUI thread ~1.5% of a
core) and at once when the worker signals that a job ended; draining updates the run
records (plain Python), then the window's views repaint from them. It knows the views
by name (the window passes itself) but holds no layout and no dialogs of its own.

A race (the Race tab) keys its runs by method name ("ar", "dflash+lookup", ...); the views follow
the method running until the user picks one in the race table.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QObject, QTimer, Signal

from engine.decode.cancel import CancelToken
from engine.decode.events import CalibrationEvent, PrefillEvent, StartEvent, to_dict
from app.jobs import (
    AdviceReady, AdviseJob, EngineEvent, JobDone, LoadFailed, Loaded, LoadJob, LoadProgress, MethodDone, PairInfo,
    ParityDone, RaceDone, RaceJob, RunFailed, RunJob,
)
from app.files import Comparison
from app.run_record import RunRecord
from app.throttle import Throttle
from app.worker import WorkerHost
from app.run_messages import (
    advice_note, calibration_left_s, calibration_message, count_setting, done_message, prefill_message,
)

FIRST_REFRESH_MS = 50  # after Run: soon enough to show the first tokens
REFRESH_MIN_S = 0.1  # views refresh at most this often...
REFRESH_BUDGET = 0.015  # ...and slower when the GUI thread would use more than 1.5% of wall time,
REFRESH_MAX_S = 1.0  # ...but never less often than this
PLOT_MIN_S = 1.0  # plots (the costliest repaint) at most this often, and every other refresh


class RunController(QObject):
    # Emitted after the drain that handled the worker's JobDone, so views already hold everything.
    job_finished = Signal(str)
    run_finished = Signal()
    load_finished = Signal(bool)

    def __init__(self, window):  # app.window.MainWindow: its views are what the controller updates
        super().__init__(window)
        # A weak reference: a window <-> controller cycle would leave closed windows to the
        # garbage collector, which may run on the worker thread and deadlock freeing Qt objects.
        self.w = weakref.proxy(window)
        self.host = WorkerHost(window)
        self.loaded: Optional[PairInfo] = None
        self.runs: dict[str, RunRecord] = {}
        self.current_run: Optional[RunRecord] = None  # shown in Output
        self.rounds_run: Optional[RunRecord] = None  # shown in Rounds and the round plots
        self.parity: Optional[ParityDone] = None
        self.race: Optional[RaceDone] = None
        self.race_runs: dict[str, RunRecord] = {}  # the last race's runs, kept past other runs for its table
        self.race_pinned: Optional[str] = None  # the race method the user chose to watch (else the running one)
        self.replaying: Optional[Path] = None
        self.job_mode: Optional[str] = None  # mode of the last run submitted
        self.active: Optional[tuple[int, Any]] = None  # (job id, job) of the job the user is waiting on
        self._starting_mode: Optional[str] = None  # a run submitted whose first event has not come yet
        self._output_waits: Optional[RunRecord] = None  # started, shown in Output once it writes
        # (steps done before, when) at this run's first step of the cost curve's measurement
        self._calibration_start: Optional[tuple[int, float]] = None
        self._throttle = Throttle(REFRESH_MIN_S, REFRESH_BUDGET, REFRESH_MAX_S)
        self._last_plot = 0.0
        self._dirty = False
        self.timer = QTimer(self, singleShot=True)
        self.timer.timeout.connect(self.tick)
        self.host.worker.job_done.connect(self.tick)  # queued: the last events, without waiting

    @property
    def busy(self) -> bool:
        return self.active is not None

    # ---- submitting ------------------------------------------------------------------------

    def _submit(self, job: Any) -> None:
        job_id = self.host.submit(job)
        self.active = (job_id, job)
        self._throttle.reset()  # what the GUI did between jobs (clicks, the last run's plots) is not this job's
        if self.loaded is not None:  # an opened trace showed the device it was made on
            self.w.status_line.show_device(self.loaded.device)
        self.w.prompt.set_running(True)
        self.w.race_view.set_running(True)
        self.w.models.load_button.setEnabled(False)
        self._last_plot = time.perf_counter()  # nothing to plot yet: the first refresh skips the plots
        self.timer.start(FIRST_REFRESH_MS)

    def start_load(self, target: str, drafter: Optional[str]) -> None:
        self.w.models.set_loading(True)
        self.w.models.status.setText("loading…")
        self._submit(LoadJob(target, drafter))

    def _load_first(self, target: str, drafter: Optional[str], cancel: CancelToken) -> Optional[LoadJob]:
        """The load a run needs first when the chosen pair is not the loaded one."""
        if self.loaded is not None and (self.loaded.target, self.loaded.drafter) == (target, drafter):
            return None
        self.w.models.set_loading(True)
        return LoadJob(target, drafter, cancel=cancel)

    def start_run(self, target: str, drafter: Optional[str]) -> None:
        """Run the prompt with the current settings, loading the chosen pair first if it changed."""
        prompt = self.w.prompt
        cancel = CancelToken()
        load = self._load_first(target, drafter, cancel)
        job = RunJob(prompt.prompt(), prompt.chat_flag(), prompt.thinking_flag(), prompt.mode(),
                     prompt.settings(), load=load, cancel=cancel)
        # the views make way when the run starts (its first event): a run refused before it starts (a
        # prompt over the context, say) leaves the last results on show
        self._starting_mode = job.mode
        self.w.statusBar().showMessage("running…")
        self._submit(job)

    def start_race(self, target: str, drafter: Optional[str], methods: list[str], draft_model: Optional[str],
                   num_draft: int) -> None:
        """Run the prompt with each method in turn (AR first), the prompt panel's settings for all."""
        prompt = self.w.prompt
        cancel = CancelToken()
        load = self._load_first(target, drafter, cancel)
        settings = replace(prompt.settings(), draft_model=draft_model, num_draft=num_draft)
        job = RaceJob(prompt.prompt(), prompt.chat_flag(), prompt.thinking_flag(), tuple(methods), settings,
                      load=load, cancel=cancel)
        self.clear_runs()
        self.job_mode = "race"
        self.race_runs = self.runs
        self.w.race_view.start(methods)
        self.w.statusBar().showMessage("racing: " + ", ".join(methods) + "…")
        self._submit(job)

    def show_method(self, method: str) -> None:
        """A race method's run in the output, rounds, plots and status (the user picked its row)."""
        if self.job_mode != "race" and method in self.race_runs and not self.busy:  # the last race, again
            self.clear_runs()
            self.job_mode, self.runs = "race", self.race_runs
        run = self.runs.get(method)
        if run is None or (self.race_pinned == method and self.current_run is run):
            return
        self.race_pinned = method
        self.current_run = run
        self.rounds_run = run if method != "ar" else None
        w = self.w
        w.output.set_run(run)
        w.rounds.set_run(self.rounds_run)
        w.plots.update_runs(self.runs, self.rounds_run)
        w.why_view.update_run(self.rounds_run, self.runs.get("ar"))
        w.selector_view.update_run(self.rounds_run)
        w.update_status()

    def advise(self) -> None:
        """Ask the worker for the block-size advice on the run in the Rounds view."""
        run = self.rounds_run
        if self.busy:
            return
        if run is None or run.summary is None or not run.rounds:
            self.w.notify("run DFlash (or open a DFlash trace) first: the advisor learns from its rounds.")
            return
        ar = self.runs.get("ar")
        ar_tok_s = ar.summary.tok_per_s if ar is not None and ar.summary is not None else None
        self.w.statusBar().showMessage("advising: measuring the cost curve (cached after the first time)…")
        settings = run.start.settings
        self._submit(AdviseJob([to_dict(r) for r in run.rounds], run.summary.decode_s, ar_tok_s,
                               settings.get("block_size"), count_setting(settings.get("draft_window")),
                               count_setting(settings.get("draft_sink")), settings.get("sampling")))

    def stop(self) -> None:
        """Cancel the job in progress: a run stops within one round, a load between stages."""
        if self.active is not None:
            self.active[1].cancel.cancel()
            self.w.statusBar().showMessage("stopping…")

    def clear_runs(self) -> None:
        self._output_waits = None
        self.runs = {}
        self.current_run = None
        self.rounds_run = None
        self.parity = None
        self.race = None
        self.race_pinned = None
        self.replaying = None
        self.w.clear_run_views()

    def show_replay(self, opened: RunRecord | Comparison, path: Path) -> None:
        """A trace's run shown like a finished one; a parity check's two runs and verdict as a Both run."""
        self.clear_runs()
        self.replaying = path
        if isinstance(opened, Comparison):
            self.job_mode, self.parity = "both", opened.parity
            runs = opened.runs
        else:
            self.job_mode, runs = None, [opened]
        self.runs = {r.mode: r for r in runs}
        for r in runs:
            r.replayed = True
        run = runs[-1]
        self.current_run = run
        self.rounds_run = run if run.rounds else None
        self.w.output.set_run(run)
        self.w.rounds.set_run(self.rounds_run)
        self.w.plots.update_runs(self.runs, self.rounds_run)
        self.w.why_view.update_run(self.rounds_run, self.runs.get("ar"))
        self.w.selector_view.update_run(self.rounds_run)
        if isinstance(opened, Comparison):
            self.w.show_parity(opened.parity, opened.ar, opened.dflash)
        self.w.update_status()

    def shown(self) -> Optional[RunRecord | Comparison]:
        """What exports write: in a race, the method on show (the row picked, else the one running); a
        Both run as the comparison it is (both runs, and the verdict once there is one); otherwise the
        DFlash run when there is one, else the last run."""
        if self.job_mode == "race":
            return self.current_run
        if self.job_mode == "both" and "ar" in self.runs:
            return Comparison(self.runs["ar"], self.runs.get("dflash"), self.parity)
        return self.runs.get("dflash") or self.current_run

    # ---- draining the worker ---------------------------------------------------------------

    def tick(self) -> None:
        """Drain the worker's queue, refresh the views, and schedule the next refresh."""
        done = []
        for msg in self.host.take():
            if isinstance(msg, JobDone):
                done.append(msg)
            else:
                self.handle(msg)
        if done or (self._dirty and self._throttle.due()):
            self._refresh_views(final=bool(done))
        for msg in done:
            self._job_done(msg)
        if self.host.busy or self._dirty:  # poll no faster than FIRST_REFRESH_MS while waiting
            wait = max(self._throttle.next_at - time.perf_counter(), FIRST_REFRESH_MS / 1000)
            self.timer.start(int(wait * 1000))
        else:
            self.timer.stop()

    def handle(self, msg: Any) -> None:
        """One worker message, dispatched by type."""
        w = self.w
        if isinstance(msg, EngineEvent):
            self._engine_event(msg)
        elif isinstance(msg, LoadProgress):
            w.models.set_progress(msg.stage, msg.frac)
        elif isinstance(msg, Loaded):
            self.loaded = msg.info
            w.pair_loaded(msg.info)
        elif isinstance(msg, LoadFailed):
            self.loaded = msg.kept  # the pair loaded before, when the worker kept it (or read it back)
            w.pair_failed(msg.message, msg.cancelled)
            if msg.kept is not None:
                w.models.status.setText(f"still loaded: {Path(msg.kept.target).name}"
                                        + (f" + {Path(msg.kept.drafter).name}" if msg.kept.drafter else ""))
        elif isinstance(msg, AdviceReady):
            run = self.rounds_run
            block = run.start.settings.get("block_size") if run is not None else None
            replayed = self.replaying is not None and self.loaded is not None
            note = advice_note(msg.advice, self.loaded.target if replayed else None)
            w.why_view.show_advice(msg.curve, msg.advice, block, note)
            w.statusBar().showMessage("advice ready (Why tab)")
        elif isinstance(msg, ParityDone):
            self.parity = msg
            self._dirty = True
        elif isinstance(msg, MethodDone):
            w.race_view.set_result(msg, self.runs.get(msg.method))
        elif isinstance(msg, RaceDone):
            self.race = msg
            w.race_view.finish(msg)
        elif isinstance(msg, RunFailed):
            w.show_error("The run failed", msg.message)

    def _engine_event(self, msg: EngineEvent) -> None:
        if self._starting_mode is not None:  # the run started: the last one's results make way
            self.clear_runs()
            self._calibration_start = None
            self.job_mode, self._starting_mode = self._starting_mode, None
        if isinstance(msg.event, PrefillEvent):  # progress only: not part of the run's record or trace
            self.w.statusBar().showMessage(prefill_message(msg.label, msg.event))
            return
        if isinstance(msg.event, CalibrationEvent):
            if self._calibration_start is None:  # this run's first step (a stopped measurement goes on)
                self._calibration_start = (msg.event.done - 1, time.monotonic())
            before, since = self._calibration_start
            left = calibration_left_s(msg.event.done - before, msg.event.total - before, time.monotonic() - since)
            self.w.progress.show_progress(calibration_message(self.runs.get(msg.label)), msg.event.done,
                                          msg.event.total, left)
            self.w.statusBar().showMessage(f"{msg.label}: measuring the cost curve (progress above the tabs)")
            return
        self.w.progress.finish()
        if isinstance(msg.event, StartEvent):
            table = self.loaded.token_table if self.loaded else None
            run = RunRecord(msg.event, msg.header, table)
            self.runs[msg.label] = run
            if self.race_pinned is None:  # follow the run in progress unless the user picked a race method
                self.current_run = run
                if self.job_mode == "both" and "ar" in self.runs:  # AR's text stays up, whole, until DFlash's
                    self._output_waits = run  # comes (its first run measures the cost curve first: ~20 s)
                    self.w.output.refresh()  # the last refresh was throttled: AR's last tokens may be unshown
                else:
                    self.w.output.set_run(run)
                if msg.label == "dflash" or (self.job_mode == "race" and msg.label != "ar"):
                    self.rounds_run = run
                    self.w.rounds.set_run(run)
                if self.job_mode == "race":
                    self.w.race_view.mark_shown(msg.label)
        else:
            run = self.runs.get(msg.label)
            if run is not None:
                run.add(msg.event)
                if run is self._output_waits:
                    self._output_waits = None
                    self.w.output.set_run(run)
        self._dirty = True

    def _refresh_views(self, final: bool = False) -> None:
        w = self.w
        self._throttle.started()
        w.output.refresh()
        w.rounds.refresh()
        if self.job_mode == "both":
            w.parity_view.show_runs(self.runs.get("ar"), self.runs.get("dflash"))
        elif self.job_mode == "race":
            w.race_view.refresh(self.runs)
        w.update_status()
        now = time.perf_counter()
        if final or now - self._last_plot >= max(PLOT_MIN_S, 2 * self._throttle.last_gap):
            self._last_plot = now
            w.plots.update_runs(self.runs, self.rounds_run)
            w.why_view.update_run(self.rounds_run, self.runs.get("ar"))
            w.selector_view.update_run(self.rounds_run)
            self._dirty = False
        if final:
            self._dirty = False
            w.rounds.show_start()
            if self.parity is not None and "ar" in self.runs:  # no "dflash" when Stop ended AR's run
                w.show_parity(self.parity, self.runs["ar"], self.runs.get("dflash"))

    def _job_done(self, msg: JobDone) -> None:
        w = self.w
        if self.active is not None and self.active[0] == msg.job_id:
            self.active = None
        w.progress.finish()
        w.prompt.set_running(False)
        w.race_view.set_running(False)
        w.models.set_loading(False)
        w.models.load_button.setEnabled(True)
        if msg.kind == "run":
            run = self.current_run
            if self._starting_mode is not None:  # refused, failed or stopped before it started
                self._starting_mode = None
                w.statusBar().showMessage("stopped before the run started" if msg.cancelled else
                                          "the run did not start" + ("; the last results are still on show"
                                                                     if self.runs else ""))
            elif run is not None and run.summary is not None:
                message = done_message(run.summary, after_ar=self.job_mode == "both" and run.mode == "dflash")
                w.statusBar().showMessage(message)
            elif msg.cancelled:
                w.statusBar().showMessage("stopped")
            self.job_finished.emit(msg.kind)
            self.run_finished.emit()
        elif msg.kind == "race":
            self._race_done(msg)
            self.job_finished.emit(msg.kind)
            self.run_finished.emit()
        elif msg.kind == "load":
            self.job_finished.emit(msg.kind)
            self.load_finished.emit(msg.ok)
        else:  # advise
            self.job_finished.emit(msg.kind)

    def _race_done(self, msg: JobDone) -> None:
        race = self.race
        if race is None:  # failed or stopped before it started: the error (if any) is shown already
            self.w.race_view.finish(RaceDone([], msg.cancelled))
            if msg.cancelled:
                self.w.notify("race stopped before any method ran")
            return
        if race.cancelled:
            cut = [m for m in self.w.race_view.results if m not in race.methods]  # the one Stop ended part-way
            self.w.notify(f"race stopped: {len(race.methods)} of {len(self.w.race_view.rows)} methods finished"
                          + (f", {cut[0]} stopped part-way" if cut else "") + "; their figures are in the Race tab")
            return
        ar = self.runs.get("ar")
        ar_tps = ar.summary.tok_per_s if ar is not None and ar.summary is not None else None
        fastest = max(race.methods, key=lambda m: self.runs[m].summary.tok_per_s)
        speed = self.runs[fastest].summary.tok_per_s
        self.w.statusBar().showMessage(f"race: {len(race.methods)} methods; fastest {fastest} {speed:.1f} tok/s"
                                       + (f" (×{speed / ar_tps:.2f} AR)" if ar_tps else ""))

    def shutdown(self) -> bool:
        """Stop the worker (bounded); False when it did not stop in time."""
        self.timer.stop()
        stopped = self.host.shutdown()
        self.host.take()
        return stopped
