"""The server on a thread of this process: the command's (which waits on it), the window's Serve view's
and the tests' (which go on with their own work while it serves).

uvicorn serves a socket bound here first, so a port in use is refused before anything loads, and a
request sent before uvicorn has started waits in the socket's backlog instead of being refused.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable, Optional

from engine.decode.settings import GenerationSettings
from engine.errors import DFlashError
from engine.models.pair import LoadedPair
from engine.serve.defaults import DEFAULT_MAX_TOKENS, DEFAULT_QUEUE, PREFIX_CAPACITY


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (connections wait in its backlog until the server accepts them)."""
    if not 0 <= port <= 65535:
        raise DFlashError(f"port {port} is outside 0..65535.")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DFlashError(f"host '{host}' is not an address this machine can listen on ({exc.strerror}).") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise DFlashError(f"cannot listen on {host}:{port} ({exc.strerror}); another server may hold the port: "
                          "give another --port.") from None
    sock.listen(128)
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host if ':' not in host else f'[{host}]'}:{port}"


class Serving:
    """`pair` served on `sock` (see bind) until stop(); `watch(request_id, endpoint, item)` hears every
    request's events on the decode thread (the window's request list)."""

    def __init__(self, pair: LoadedPair, sock: socket.socket, base: GenerationSettings, *, api_key: Optional[str] = None,
                 max_queue: int = DEFAULT_QUEUE, prefix_capacity: int = PREFIX_CAPACITY,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS,
                 watch: Optional[Callable[[int, str, Any], None]] = None):
        import uvicorn

        from engine.serve.app import Server, create_app
        from engine.serve.engine_queue import EngineQueue
        from engine.serve.prompting import ServeConfig

        config = ServeConfig(base, model_id=pair.target_path.name, default_max_tokens=default_max_tokens)
        self.sock = sock
        self.url = base_url(sock)
        self.server = Server(pair, config, EngineQueue(pair, max_queue, prefix_capacity), api_key, watch=watch)
        self._uvicorn = uvicorn.Server(uvicorn.Config(create_app(self.server), log_level="warning"))
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [sock]}, name="dflash-serve",
                                        daemon=True)
        self._thread.start()

    @property
    def engine(self):
        return self.server.engine

    def wait(self) -> None:
        """Until the server stops (Ctrl-C: uvicorn stops on SIGINT only in the main thread, so the wait is
        interruptible here instead)."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving: open streams end, the running run stops at its round's end, waiting ones are refused."""
        self._uvicorn.should_exit = True
        self.server.engine.close(timeout)
        self._thread.join(timeout)
        self.sock.close()
