"""Request ids: every response carries ``X-Request-Id``, the caller's own when it sent a usable one.

sglang-router forwards a client's ``X-Request-Id`` (and ``X-Correlation-Id``, ``X-Trace-Id``,
``Request-Id``) to the worker it picks and returns it to the client, so one id follows a request from
the client through the router to the replica's log. A request without one gets a fresh id here.
Handlers read it from ``request.state.request_id``.

Example:
    >>> clean_request_id("trace-42") == "trace-42", clean_request_id("bad id\\n") is None
    (True, True)
"""

from __future__ import annotations

import logging
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

HEADER = "x-request-id"
_INCOMING = (b"x-request-id", b"x-correlation-id", b"x-trace-id", b"request-id")
_VALID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")  # printable, no spaces: safe in logs and headers


def clean_request_id(value: str) -> str | None:
    """``value`` if it is a usable request id (1-128 visible ASCII characters, no spaces), else None."""
    return value if _VALID.fullmatch(value) else None


class RequestIdMiddleware:
    """Takes the caller's request id (or makes one), exposes it to handlers, echoes it in the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (HEADER.encode(), request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != header[0]]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        log.debug("%s %s request_id=%s", scope.get("method"), scope.get("path"), request_id)
        await self.app(scope, receive, send_with_id)


def _incoming(scope: Scope) -> str | None:
    found = {name.lower(): value for name, value in scope.get("headers", [])}
    for name in _INCOMING:
        raw = found.get(name)
        if raw is not None:
            cleaned = clean_request_id(raw.decode("latin-1"))
            if cleaned is not None:
                return cleaned
    return None
