"""One run's events on the server's event loop, from the decode thread; its client leaving cancels it."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, AsyncIterator, Callable, Optional

from engine.decode.cancel import CancelToken
from engine.decode.events import Event, SummaryEvent
from engine.serve.engine_queue import END, EngineQueue, Job
from engine.serve.metrics import Metrics
from engine.serve.prompting import Prepared


class Run:
    """A run queued on the decode thread (QueueFull at once when the queue is full)."""

    def __init__(self, engine: EngineQueue, prepared: Prepared, metrics: Metrics, label: str = "",
                 watch: Optional[Callable[[int, str, Any], None]] = None, request_id: int = 0):
        loop = asyncio.get_running_loop()
        self.cancel = CancelToken()
        self._inbox: asyncio.Queue = asyncio.Queue()

        def deliver(item) -> None:  # on the decode thread: counted there, so a run whose client left counts too
            metrics.observe(item)
            if watch is not None:
                watch(request_id, label, item)
            if isinstance(item, SummaryEvent):
                print(f"{label}: {log_line(item)}", file=sys.stderr, flush=True)
            loop.call_soon_threadsafe(self._inbox.put_nowait, item)

        self.job = Job(prepared.prompt_ids, prepared.settings, deliver, self.cancel)
        engine.submit(self.job)

    def timing(self) -> dict[str, float]:
        """Where the run's time went on the server (after its summary): queued, and in the engine."""
        return {"queue_s": round(self.job.queue_s, 6), "engine_s": round(self.job.engine_s, 6)}

    async def events(self) -> AsyncIterator[Event]:
        """The run's events as they come. Left before its end (the client went, and the response's
        task was cancelled or its stream closed), the run is cancelled: it stops at its round's end."""
        finished = False
        try:
            while True:
                item = await self._inbox.get()
                if item is END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:
                self.cancel.cancel()


def log_line(summary: SummaryEvent) -> str:
    """The server's line for a finished run."""
    speed = f"{summary.tok_per_s:.1f} tok/s" if summary.timed else "untimed"
    tau = f", tau {summary.mean_acceptance_length:.2f}" if summary.mean_acceptance_length else ""
    return (f"{summary.prompt_tokens} prompt tokens ({summary.reused_tokens} cached), {summary.num_generated} "
            f"generated in {summary.decode_s:.2f} s ({speed}{tau}), {summary.stop_reason}")


async def cancel_on_disconnect(receive, cancel: CancelToken) -> None:
    """Wait for the client to leave (its request's body already read), then cancel its run. For
    answers sent whole at the end; a stream notices when a write to it fails."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.cancel()
            return
