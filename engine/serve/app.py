"""The FastAPI app: OpenAI's and Anthropic's endpoints over one EngineQueue, with errors in their shapes.

Every refusal is one line in the client's error shape with a 4xx status, and the server goes on
serving: a request's fields are checked by its model (requests.py), its prompt and settings
against the pair (prompting.py), and the key and body size before any route (guard.py).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from engine.decode.events import SummaryEvent, TextEvent
from engine.errors import DFlashError
from engine.models.pair import LoadedPair
from engine.serve import figures
from engine.serve.anthropic_shapes import Message
from engine.serve.engine_queue import EngineQueue, QueueFull
from engine.serve.errors import ApiError, error_body
from engine.serve.guard import Guard, is_anthropic
from engine.serve.metrics import CONTENT_TYPE, Metrics
from engine.serve.openai_shapes import Reply, models_list
from engine.serve.prompting import Prepared, ServeConfig, chat_ids, completion_ids, prepare
from engine.serve.requests import ChatRequest, CompletionRequest, MessagesRequest
from engine.serve.stream import Run, cancel_on_disconnect
from engine.serve.validation import validation_message

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Server:
    """What the routes share: the pair (read-only here: only the decode thread runs it), the queue."""
    pair: LoadedPair
    config: ServeConfig
    engine: EngineQueue
    api_key: Optional[str] = None
    watch: Optional[Callable[[int, str, Any], None]] = None  # (request id, endpoint, event), on the decode thread
    started: int = field(default_factory=lambda: int(time.time()))
    metrics: Metrics = None  # type: ignore[assignment]
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self):
        if self.metrics is None:
            self.metrics = Metrics(lambda: self.engine.running, lambda: self.engine.waiting)


async def _text_of(run: Run, summary_box: list) -> AsyncIterator[str]:
    """The run's text as it streams; its summary lands in summary_box. Whatever the deltas held back
    and the summary has (a tail released at the end) is sent last, so the stream adds up to the text."""
    sent = []
    async for event in run.events():
        if isinstance(event, TextEvent) and event.text:
            sent.append(event.text)
            yield event.text
        elif isinstance(event, SummaryEvent):
            summary_box.append(event)
    text = "".join(sent)
    summary = summary_box[-1]
    if summary.text.startswith(text) and len(summary.text) > len(text):
        yield summary.text[len(text):]


async def _whole(request: Request, run: Run) -> SummaryEvent:
    watcher = asyncio.create_task(cancel_on_disconnect(request.receive, run.cancel))
    try:
        async for event in run.events():
            if isinstance(event, SummaryEvent):
                return event
    finally:
        watcher.cancel()
    raise DFlashError("the run ended without a summary.")


def _error_chunk(exc: BaseException, anthropic: bool) -> str:
    status = exc.status if isinstance(exc, ApiError) else (400 if isinstance(exc, DFlashError) else 500)
    message = " ".join(str(exc).split()) or type(exc).__name__
    body = error_body(status, message, None, anthropic)
    return figures.sse(body, "error" if anthropic else None)


def create_app(server: Server) -> Any:
    """The ASGI app: FastAPI's routes inside the Guard (key and body size)."""
    app = FastAPI(title="dflash-playground", docs_url=None, redoc_url=None, openapi_url=None)
    pair, config, engine, metrics = server.pair, server.config, server.engine, server.metrics

    def _refuse(request: Request, status: int, message: str, param: Optional[str] = None,
                headers: Optional[dict[str, str]] = None) -> JSONResponse:
        metrics.refused.labels(str(status)).inc()
        return JSONResponse(error_body(status, message, param, is_anthropic(request.url.path)), status, headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return _refuse(request, 400, message, param)

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError):
        return _refuse(request, exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull):
        return _refuse(request, 429, str(exc), None, {"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(DFlashError)
    async def _refused(request: Request, exc: DFlashError):
        return _refuse(request, 400, " ".join(str(exc).split()))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        what = f"no {request.method} {request.url.path} here" if exc.status_code in (404, 405) else str(exc.detail)
        return _refuse(request, exc.status_code, f"{what}; see GET /v1/models, POST /v1/chat/completions, "
                                                 "/v1/completions, /v1/messages.")

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        traceback.print_exception(exc, file=sys.stderr)  # the server's log: a bug to report, not bad input
        return _refuse(request, 500, f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())}")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": config.model_id, "running": engine.running, "waiting": engine.waiting}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return models_list(config.model_id, server.started)

    def _run(request: Request, prepared: Prepared) -> Run:
        return Run(engine, prepared, metrics, request.url.path, server.watch, next(server.ids))

    async def _openai(request: Request, prepared: Prepared, body, chat: bool):
        reply, run = Reply(prepared.model, chat), _run(request, prepared)
        if not body.stream:
            summary = await _whole(request, run)
            return reply.whole(summary, figures.speculative(summary, run.timing()))
        usage = body.include_usage

        async def chunks() -> AsyncIterator[str]:
            box: list = []
            try:
                if chat:
                    yield figures.sse(reply.chunk("", usage, first=True))
                async for text in _text_of(run, box):
                    yield figures.sse(reply.chunk(text, usage))
            except Exception as exc:  # noqa: BLE001 - mid-stream: the error goes down the stream
                yield _error_chunk(exc, anthropic=False)
                return
            yield figures.sse(reply.last_chunk(box[-1], usage, figures.speculative(box[-1], run.timing())))
            if usage:
                yield figures.sse(reply.usage_chunk(box[-1]))
            yield figures.sse("[DONE]")

        return StreamingResponse(chunks(), media_type="text/event-stream", headers=SSE_HEADERS)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        ids = chat_ids(pair, body.conversation())
        return await _openai(request, prepare(pair, config, body, ids, body.stop, body.token_limit), body, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        ids = completion_ids(pair, body.prompt)
        return await _openai(request, prepare(pair, config, body, ids, body.stop, body.token_limit), body, chat=False)

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request):
        ids = chat_ids(pair, body.conversation())
        prepared = prepare(pair, config, body, ids, body.stop, body.token_limit)
        message, run = Message(prepared.model, len(ids)), _run(request, prepared)
        stop_of = lambda s: figures.matched_stop(s, pair.tokenizer, body.stop)  # noqa: E731
        if not body.stream:
            summary = await _whole(request, run)
            return message.whole(summary, stop_of(summary), figures.speculative(summary, run.timing()))

        async def events() -> AsyncIterator[str]:
            box: list = []
            yield message.start_events()
            try:
                async for text in _text_of(run, box):
                    yield message.delta_event(text)
            except Exception as exc:  # noqa: BLE001 - mid-stream: the error goes down the stream
                yield _error_chunk(exc, anthropic=True)
                return
            yield message.end_events(box[-1], stop_of(box[-1]), figures.speculative(box[-1], run.timing()))

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    return Guard(app, server.api_key)
