"""Before any route: the API key and the body's size, answered in the client's error shape.

An ASGI middleware, so a refused body is never parsed and a huge one never held: the body is
read up to the limit, then handed to the app whole (and the connection's later messages, such as
a disconnect, after it).
"""

from __future__ import annotations

import hmac
import json
from typing import Optional

from engine.serve.defaults import MAX_BODY_BYTES
from engine.serve.errors import error_body

OPEN_PATHS = ("/health",)  # answered without a key: a load balancer's or a launcher's probe


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


async def send_error(send, status: int, message: str, path: str, headers: Optional[dict[str, str]] = None) -> None:
    body = json.dumps(error_body(status, message, None, is_anthropic(path))).encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())] + extra})
    await send({"type": "http.response.body", "body": body})


def _key_of(headers: dict[bytes, bytes]) -> Optional[str]:
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key is not None else None


class Guard:
    def __init__(self, app, api_key: Optional[str], max_body: int = MAX_BODY_BYTES):
        self.app = app
        self.api_key = api_key
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = dict(scope["headers"])
        if self.api_key and path not in OPEN_PATHS:
            given = _key_of(headers)
            if given is None:
                return await send_error(send, 401, "no API key: send it as 'Authorization: Bearer KEY' or "
                                                   "'x-api-key: KEY' (the server was started with --api-key).", path)
            if not hmac.compare_digest(given.encode("utf-8", "replace"), self.api_key.encode()):
                return await send_error(send, 401, "the API key is wrong.", path)
        length = headers.get(b"content-length")
        too_big = f"the request body is over {self.max_body // 1024} KiB, this server's limit."
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await send_error(send, 413, too_big, path)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body arrived
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                return await send_error(send, 413, too_big, path)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return whole
            return await receive()

        await self.app(scope, replay, send)
