"""Back-pressure: a request-body size cap (413) and a cap on concurrent generations (429)."""

from __future__ import annotations

import json
import threading

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.api.errors import TooManyRequests, error_body


class BodyTooLarge(Exception):
    """Raised from ``receive`` once a body passes the limit (the middleware answers 413)."""


class BodyLimitMiddleware:
    """Answer 413 (JSON, OpenAI's error shape) to any request whose body exceeds ``max_bytes``.

    A declared ``Content-Length`` over the limit is refused before reading; a chunked body is counted
    as it arrives. Whatever the app had started to answer is replaced by the 413.

    Example:
        >>> app.add_middleware(BodyLimitMiddleware, max_bytes=1 << 20)   # doctest: +SKIP
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:  # the app answered after the overflow (e.g. as a parse error): drop it
                return
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except BodyTooLarge:
            pass
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            error_body(
                413, f"request body exceeds the limit of {self.max_bytes} bytes", code="request_too_large"
            )
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class Admission:
    """At most ``limit`` generations in flight; the next one is refused at once (429), never queued.

    Example:
        >>> gate = Admission(limit=2)
        >>> admitted = gate.enter()      # raises TooManyRequests when full
        >>> gate.in_flight
        1
        >>> admitted.release(); gate.in_flight
        0
    """

    def __init__(self, limit: int, retry_after_s: float = 1.0) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self._count = 0
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return self._count

    def enter(self) -> Admitted:
        with self._lock:
            if self._count >= self.limit:
                raise TooManyRequests(
                    f"too many requests in flight ({self._count} of {self.limit}); retry later",
                    self.retry_after_s,
                )
            self._count += 1
        return Admitted(self)

    def _leave(self) -> None:
        with self._lock:
            self._count -= 1


class Admitted:
    """One admitted generation; ``release()`` is idempotent (call it when the response ends)."""

    def __init__(self, gate: Admission) -> None:
        self._gate: Admission | None = gate

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._leave()

    def __enter__(self) -> Admitted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
