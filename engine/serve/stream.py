"""One run's events on the server's event loop, from the decode thread; its client leaving cancels it."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from engine.decode.cancel import CancelToken
from engine.decode.events import Event
from engine.serve.engine_queue import END, EngineQueue, Job
from engine.serve.metrics import Metrics
from engine.serve.prompting import Prepared


class Run:
    """A run queued on the decode thread (QueueFull at once when the queue is full)."""

    def __init__(self, engine: EngineQueue, prepared: Prepared, metrics: Metrics):
        loop = asyncio.get_running_loop()
        self.cancel = CancelToken()
        self._inbox: asyncio.Queue = asyncio.Queue()

        def deliver(item) -> None:  # on the decode thread: counted there, so a run whose client left counts too
            metrics.observe(item)
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


async def cancel_on_disconnect(receive, cancel: CancelToken) -> None:
    """Wait for the client to leave (its request's body already read), then cancel its run. For
    answers sent whole at the end; a stream notices when a write to it fails."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.cancel()
            return
