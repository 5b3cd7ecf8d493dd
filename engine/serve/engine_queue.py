"""One decode thread owns the loaded pair; runs queue on it, bounded.

A run is a `Job`: prompt ids, settings, a CancelToken, and `deliver`, called on the decode thread
with each event, then with END (or the exception that ended it). The server's handlers deliver
into their event loop. Another user of the same pair (the window's worker, while the window
serves it) hands its own work to `call`, which runs it on the decode thread in its turn. The queue holds at most `max_waiting` jobs besides the running one:
past that, `submit` raises QueueFull (the server's 429). A job cancelled while it waits never runs;
one cancelled while it runs stops at the end of its round, and the engine leaves its caches whole.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from engine.decode.cancel import CancelToken
from engine.decode.generate import generate
from engine.decode.events import SummaryEvent
from engine.decode.prefix_cache import PrefixCache
from engine.decode.settings import GenerationSettings
from engine.errors import DFlashError
from engine.models.pair import LoadedPair
from engine.serve.defaults import DEFAULT_QUEUE, PREFIX_CAPACITY

END = object()  # delivered after a job's last event


class QueueFull(DFlashError):
    """More jobs than the queue holds; `retry_after_s` estimates when one will have left."""

    def __init__(self, waiting: int, retry_after_s: int):
        super().__init__(f"the server is busy: {waiting} requests are waiting for the engine; retry in "
                         f"{retry_after_s} s.")
        self.retry_after_s = retry_after_s


class NotRun(DFlashError):
    """What a job that never ran is told: its client left while it waited, or the queue closed."""

    def __init__(self, cancelled: bool):
        super().__init__("the request was cancelled before it ran." if cancelled else "the server is shutting down.")
        self.cancelled = cancelled


@dataclass
class Job:
    prompt_ids: list[int]
    settings: GenerationSettings
    deliver: Callable[[Any], None]  # called on the decode thread: each event, then END or an exception
    cancel: CancelToken = field(default_factory=CancelToken)
    submitted: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0  # waiting for the decode thread
    engine_s: float = 0.0  # in generate(), from its call to its summary
    work: Optional[Callable[[], Any]] = None  # `call`'s: run instead of generate(), its result delivered


class EngineQueue:
    """The pair's one decode thread and the jobs waiting for it, in submission order."""

    def __init__(self, pair: LoadedPair, max_waiting: int = DEFAULT_QUEUE, prefix_capacity: int = PREFIX_CAPACITY):
        self.pair = pair
        self.max_waiting = max_waiting
        self.prefix = PrefixCache(prefix_capacity)  # only the decode thread touches it
        self._jobs: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running: Optional[Job] = None
        self._closing = False
        self._durations: collections.deque[float] = collections.deque(maxlen=16)
        self._thread = threading.Thread(target=self._loop, name="dflash-decode", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> int:
        return int(self._running is not None)

    def submit(self, job: Job, bounded: bool = True) -> None:
        with self._lock:
            if bounded and self._waiting >= self.max_waiting:
                raise QueueFull(self._waiting, self._retry_after())
            self._waiting += 1
        self._jobs.put(job)

    def call(self, work: Callable[[], Any], cancel: Optional[CancelToken] = None) -> Any:
        """Run `work()` on the decode thread in its turn (past the bound: one caller's one job), and
        return what it returns or raise what it raises; NotRun when `cancel` was set before its turn."""
        done, box = threading.Event(), []

        def deliver(item) -> None:
            box.append(item)
            done.set()

        self.submit(Job([], None, deliver, cancel or CancelToken(), work=work), bounded=False)  # type: ignore[arg-type]
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def close(self, timeout: float = 10.0) -> None:
        """Stop: the running job at the end of its round; waiting ones are told and never run."""
        self._closing = True
        self._jobs.put(None)
        running = self._running
        if running is not None:
            running.cancel.cancel()
        self._thread.join(timeout)

    def _retry_after(self) -> int:
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return max(1, round(mean * (self._waiting + 1)))

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
                self._running = job
            try:
                if self._closing or job.cancel.cancelled:  # the queue closed, or the client left while it waited
                    _tell(job, NotRun(cancelled=not self._closing))
                else:
                    self._run(job)
            finally:
                with self._lock:
                    self._running = None

    def _run(self, job: Job) -> None:
        start = time.perf_counter()
        job.queue_s = start - job.submitted
        if job.work is not None:
            try:
                result = job.work()
            except Exception as exc:  # noqa: BLE001 - its caller's to handle
                result = exc
            _tell(job, result)
            return
        try:
            for event in generate(self.pair, job.prompt_ids, job.settings, job.cancel, prefix=self.prefix):
                if isinstance(event, SummaryEvent):
                    job.engine_s = time.perf_counter() - start
                _tell(job, event)
        except Exception as exc:  # noqa: BLE001 - a failed run is its client's error, never a dead thread
            _tell(job, exc)
            return
        finally:
            self._durations.append(time.perf_counter() - start)
        _tell(job, END)


def _tell(job: Job, item: Any) -> None:
    """Deliver to a job's client; one that cannot take it (gone) has its run cancelled instead."""
    try:
        job.deliver(item)
    except Exception:  # noqa: BLE001 - whoever listened has left: the run stops at its round's end
        job.cancel.cancel()
