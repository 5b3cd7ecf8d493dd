"""The worker thread: owns every MLX object (the loaded pair, its caches), runs one job at a time.

The window submits jobs through a queued signal and drains messages from a
`queue.SimpleQueue` on a timer, so the worker never waits on the GUI and each
engine event costs it one `put`. Engine entry points (load_pair, generate,
run_parity) enter the engine's thread-local stream themselves; anything else
here that touches MLX runs inside `mx.stream(STREAM)`.
"""

from __future__ import annotations

import gc
import itertools
import logging
import queue
from dataclasses import replace
from typing import Any, Optional

from PySide6.QtCore import QObject, QThread, Qt, Signal, Slot

import engine.decode.generate as engine_generate
import engine.tools.parity as engine_parity
import engine.models.pair as engine_session
from engine.errors import DFlashError, IncompatiblePairError, LoadCancelled
from engine.models.doctor import check_pair
from engine.decode.events import StartEvent, SummaryEvent
from engine.decode.prefill import context_length
from engine.decode.prefix_cache import PrefixCache
from engine.decode.prompts import encode_prompt, format_name
from engine.tools.trace import device_line
from app.errors import is_out_of_memory, user_message
from app.jobs import (
    AdviceReady, AdviseJob, EngineEvent, JobDone, LoadFailed, Loaded, LoadJob, LoadProgress, MethodDone, PairInfo,
    ParityDone, RaceDone, RaceJob, RunFailed, RunJob, ShutdownJob,
)
from app.tokens import build_token_table

log = logging.getLogger("app.worker")


def _facts(pair) -> dict:
    """The pair's facts; for a hybrid target also which GatedDeltaNet kernels run, which may
    self-check a GPU kernel: that happens here, on the worker, never on the GUI thread."""
    facts = pair.facts()
    if facts.get("rollback") == "tape-replay":
        from kernels.gated_delta import kernel_status

        facts["gated_delta"] = kernel_status()
    return facts


def _clear_mlx_cache() -> None:
    import mlx.core as mx

    from engine.runtime.streams import STREAM

    with mx.stream(STREAM):
        mx.clear_cache()


SHUTDOWN_WAIT_S = 15.0  # how long closing the window waits for the worker thread


class Worker(QObject):
    """Lives on the worker QThread; `handle` runs each job to the end, in submission order."""

    job_done = Signal(int)  # after JobDone is queued: the window drains at once

    def __init__(self, outbox: "queue.SimpleQueue[Any]"):
        super().__init__()
        self.outbox = outbox
        self.pair = None
        self.pair_key: Optional[tuple[str, Optional[str]]] = None
        self.info: Optional[PairInfo] = None  # what the window was told of the loaded pair
        self.prefix = PrefixCache()  # the last run's caches, for the next run of the same pair
        # While the Serve tab serves this pair: the server's queue (engine/serve/engine_queue.py), on whose
        # decode thread the window's runs then run, in turn with the clients' requests.
        self.serving = None

    @Slot(object)
    def handle(self, item: tuple[int, Any]) -> None:
        job_id, job = item
        put = self.outbox.put
        ok = False
        stage = job.kind  # "load" while a run job loads its pair first
        try:
            if isinstance(job, ShutdownJob):
                self._release()
                ok = True
            elif job.cancel.cancelled:
                ok = False
            elif isinstance(job, LoadJob):
                ok = self._load(job)
            elif isinstance(job, AdviseJob):
                ok = self._on_engine(lambda: self._advise(job), job)
            elif isinstance(job, (RunJob, RaceJob)):
                stage = "load" if job.load is not None else "run"
                ok = job.load is None or self._load(job.load)
                stage = "run"
                ok = ok and self._on_engine(lambda: self._run(job) if isinstance(job, RunJob) else self._race(job), job)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a message, never a dead thread
            if isinstance(exc, DFlashError):
                # refused (a setting, the prompt's length, a draft model): the engine says no before it
                # touches the caches, so the last run's prefill stays for the next run
                log.info("%s refused: %s", stage, exc)
            else:
                log.exception("%s failed", stage)
                self.prefix.clear()  # a run that failed part-way leaves nothing to build on
            if is_out_of_memory(exc):
                _clear_mlx_cache()
            put(LoadFailed(user_message(exc), False, self.info) if stage == "load" else RunFailed(user_message(exc)))
        finally:
            put(JobDone(job_id, job.kind, ok, job.cancel.cancelled))
            if isinstance(job, ShutdownJob):
                QThread.currentThread().quit()
            else:
                self.job_done.emit(job_id)

    # ---- jobs ------------------------------------------------------------------------------

    def _on_engine(self, work, job) -> bool:
        """Run here, or while the pair is served on the server's decode thread, in turn."""
        return work() if self.serving is None else self.serving.call(work, job.cancel)

    def _release(self) -> None:
        if self.serving is not None:  # closing while serving: the server's thread lets go of the pair first
            self.serving.close()
            self.serving = None
        self.pair = None
        self.pair_key = None
        self.info = None
        self.prefix.clear()
        gc.collect()
        _clear_mlx_cache()

    def _load(self, job: LoadJob) -> bool:
        """Check (and download) the new pair while the loaded one stays: a typo, an incompatible
        drafter or a cancelled download costs nothing. Then free the loaded pair and read the new
        one; if that fails, the previous pair is read back, so the user keeps a working pair."""
        put = self.outbox.put
        if self.serving is not None:
            raise DFlashError("the loaded pair is being served: stop serving (the Serve tab) before loading another.")

        def progress(stage: str, frac: float) -> None:
            put(LoadProgress(stage, frac))

        def cancelled() -> bool:
            return job.cancel.cancelled

        try:
            report = check_pair(job.target, job.drafter, progress=progress, should_cancel=cancelled)
        except LoadCancelled as exc:
            put(LoadFailed(str(exc), True, self.info))
            return False
        if not report.ok:
            raise IncompatiblePairError(report.problems[0])
        previous = self.pair_key
        self._release()  # free the old pair before reading the new one
        try:
            self._open(job.target, job.drafter, progress, cancelled)
        except BaseException as exc:
            if previous is not None:
                self._reopen(previous)
            if isinstance(exc, LoadCancelled):
                put(LoadFailed(str(exc), True, self.info))
                return False
            raise
        put(Loaded(self.info))
        return True

    def _open(self, target: str, drafter: Optional[str], progress, cancelled) -> None:
        pair = engine_session.load_pair(target, drafter, progress=progress, should_cancel=cancelled)
        info = PairInfo(
            target=target,
            drafter=drafter,
            facts=_facts(pair),
            device=device_line(),  # as its traces will say it: a reopened one reads the same
            has_chat_template=bool(pair.tokenizer.has_chat_template),
            has_thinking=bool(getattr(pair.tokenizer, "has_thinking", False)),
            token_table=build_token_table(pair.tokenizer, len(pair.tokenizer)),
            vocab_size=int(pair.head.vocab_size),
            context=context_length(pair),
        )
        self.pair, self.pair_key, self.info = pair, (target, drafter), info

    def _reopen(self, key: tuple[str, Optional[str]]) -> None:
        """Read back the pair that was loaded before a failed load (it loaded once: it should again)."""
        self._release()
        try:
            self._open(*key, lambda stage, frac: None, lambda: False)
        except BaseException:  # noqa: BLE001 - the failed load's own error is the one reported
            log.exception("could not load the previous pair %s again", key)
            self._release()

    def _advise(self, job: AdviseJob) -> bool:
        from dataclasses import asdict

        from engine.decode.advisor import advise
        from engine.decode.cost_curve import cost_curve
        from engine.decode.settings import SamplingSettings

        if self.pair is None or self.pair.drafter is None:
            raise DFlashError("the advisor needs the cost curve of a loaded target and drafter; load a pair first.")
        curve, _ = cost_curve(self.pair, window=job.draft_window, sink=job.draft_sink, cancel=job.cancel,
                              sampling=SamplingSettings.from_dict(job.sampling))
        advice = advise(job.rounds, job.decode_s, curve, job.ar_tok_s, block=job.block)
        self.outbox.put(AdviceReady(asdict(curve), advice.to_dict() if advice else None))
        return True

    def _loaded_pair(self):
        if self.pair is None:
            raise DFlashError("no model is loaded; choose a target (and a drafter), then press Load or Run.")
        return self.pair

    def _run(self, job: RunJob) -> bool:
        from engine.tools.trace import header_record

        put = self.outbox.put
        pair = self._loaded_pair()
        ids = encode_prompt(pair.tokenizer, job.prompt, job.chat, job.thinking)
        label = [job.mode]
        prompt = {"text": job.prompt, "format": format_name(job.chat)}

        def emit(event) -> None:
            if isinstance(event, StartEvent):
                label[0] = event.mode
                put(EngineEvent(event.mode, event, header_record(event, prompt)))
            else:
                put(EngineEvent(label[0], event))

        if job.mode == "both":
            result = engine_parity.run_parity(pair, ids, job.settings, on_event=emit, cancel=job.cancel,
                                              prefix=self.prefix)
            dflash = result.dflash  # None when Stop ended the AR run
            put(ParityDone(
                identical=result.identical,
                first_divergence=result.first_divergence,
                margin_at_divergence=result.margin_at_divergence,
                speedup=result.speedup,
                ar_tok_s=result.ar.tok_per_s,
                dflash_tok_s=dflash.tok_per_s if dflash is not None else 0.0,
                cancelled=result.cancelled,
                mean_acceptance_length=dflash.mean_acceptance_length if dflash is not None else None,
                round_in_ar_steps=result.round_in_ar_steps,
                compared=result.compared,
                dflash_ran=dflash is not None,
                ended_at_once=result.ended_at_once,
                timed=result.timed,
            ))
        else:
            settings = replace(job.settings, mode=job.mode)
            for event in engine_generate.generate(pair, ids, settings, job.cancel, prefix=self.prefix):
                emit(event)
        return True

    def _race(self, job: RaceJob) -> bool:
        """Each method in turn on the same prompt (AR first), as `bench --methods` runs one prompt: every
        method's settings and the draft model are checked before anything runs, and the prefix cache
        lets every method after the first start from the prompt's prefill. After each method its
        figures against the AR run and, where its output differs from AR's, AR's logit margin there."""
        from engine.tools.bench import figures
        from engine.tools.race import checked_methods, race_prompt
        from engine.tools.trace import header_record

        put = self.outbox.put
        pair = self._loaded_pair()
        ids = encode_prompt(pair.tokenizer, job.prompt, job.chat, job.thinking)
        prompt = {"text": job.prompt, "format": format_name(job.chat)}
        per_method = checked_methods(pair, job.settings, job.methods)
        runs, finished = [], []
        for method, event in race_prompt(pair, ids, per_method, job.cancel, prefix=self.prefix, runs=runs):
            put(EngineEvent(method, event, header_record(event, prompt) if isinstance(event, StartEvent) else None))
            if isinstance(event, SummaryEvent):  # that method is done: its figures against AR's run
                run, ar = runs[-1], runs[0].summary
                cancelled = event.stop_reason == "cancelled"
                where, margin = engine_parity.divergence(pair, ids, ar.token_ids, event.token_ids,
                                                         priced=not cancelled)
                put(MethodDone(method, figures([ar], [event], run.rounds), where is None, where, margin, cancelled))
                if not cancelled:
                    finished.append(method)
        put(RaceDone(finished, job.cancel.cancelled))
        return True


class WorkerHost(QObject):
    """Owns the worker QThread on the GUI side: submit jobs, take messages, shut down cleanly."""

    _submit = Signal(object)

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self.outbox: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.thread = QThread()
        self.thread.setObjectName("dflash-worker")
        self.worker = Worker(self.outbox)
        self.worker.moveToThread(self.thread)
        self._submit.connect(self.worker.handle, Qt.ConnectionType.QueuedConnection)
        self._ids = itertools.count(1)
        self._open: dict[int, Any] = {}  # submitted, not yet done: their cancel tokens matter on close
        self.thread.start()

    def submit(self, job: Any) -> int:
        job_id = next(self._ids)
        self._open[job_id] = job
        self._submit.emit((job_id, job))
        return job_id

    def take(self) -> list[Any]:
        """Every message the worker has put so far, in order."""
        out = []
        while True:
            try:
                msg = self.outbox.get_nowait()
            except queue.Empty:
                return out
            if isinstance(msg, JobDone):
                self._open.pop(msg.job_id, None)
            out.append(msg)

    @property
    def busy(self) -> bool:
        return bool(self._open)

    def cancel_all(self) -> None:
        for job in self._open.values():
            job.cancel.cancel()
            if isinstance(job, (RunJob, RaceJob)) and job.load is not None:
                job.load.cancel.cancel()

    def shutdown(self, timeout_s: float = SHUTDOWN_WAIT_S) -> bool:
        """Cancel what is running or queued, free the pair on its thread, and wait for the thread, at
        most `timeout_s` (a run stops within a round, a prefill within a chunk, a download at its next
        chunk; a read of weights cannot be interrupted). False when it is still running then: the
        caller exits without waiting longer (app/main.py)."""
        if not self.thread.isRunning():
            return True
        self.cancel_all()
        self.submit(ShutdownJob())
        stopped = self.thread.wait(int(timeout_s * 1000))
        if not stopped:
            log.warning("the worker did not stop within %.0f s; leaving without it", timeout_s)
        return stopped
