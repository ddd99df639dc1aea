"""Running the app: ``serve`` (blocking, for the CLI) and ``BackgroundServer`` (a thread, for tests)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from rag.api.settings import KEEP_ALIVE_S, Settings


def serve(settings: Settings, *, log_level: str = "info") -> None:
    """Build the app from ``settings`` and serve it until interrupted.

    SIGTERM or SIGINT shut it down gracefully: the listening socket closes at once (a load balancer's
    next probe fails, so it routes elsewhere), requests in flight, streams included, get
    ``settings.shutdown_timeout_s`` to finish, then the rest are cancelled (releasing their cache
    locks) and the engine stops."""
    from rag.api.app import create_app

    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
    )


class BackgroundServer:
    """A real uvicorn server in a thread, on a port the OS picks (bound before start: no race).

    Example:
        >>> with BackgroundServer(create_app(settings, engine=engine)) as server:   # doctest: +SKIP
        ...     httpx.get(server.url + "/healthz").json()
        {'status': 'ok'}
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        keep_alive_s: int = KEEP_ALIVE_S,
    ) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        config = uvicorn.Config(
            app,
            log_level=log_level,
            lifespan="on",
            timeout_keep_alive=keep_alive_s,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="prefixrag-test-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during startup (see the log)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server did not start within {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        self._server.run(sockets=[self._sock])
