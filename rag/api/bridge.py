"""Bridge the engine's blocking iterators to asyncio without blocking the event loop.

An engine stream tells the loop of each new event itself (``RequestStream.watch``: one
``call_soon_threadsafe`` per event, from the engine's thread) and the loop takes it without blocking:
a worker thread per item would cost three thread hand-offs, each taking the interpreter lock from the
engine's thread, at a token per stream per decode step. Any other iterator's ``next()`` runs in a
worker thread. Between items the iterator is suspended and owned by nobody; whatever ends the async
iteration (the last item, an error, a client disconnect cancelling
the task, ``aclose()``), the ``finally`` closes the blocking iterator in a worker thread, shielded
from cancellation. Closing an engine stream cancels its request and waits until the request has
released its cache lock, so a client that goes away never leaves a locked prefix behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any, TypeVar, cast

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.request import RequestStream

T = TypeVar("T")
_END = object()


async def iterate_in_thread(
    it: Iterator[T], limiter: anyio.CapacityLimiter | None = None, *, taken: Iterable[T] = ()
) -> AsyncGenerator[T, None]:
    """Yield the items of a blocking iterator (after ``taken``, items already read from it); always
    close it, also on cancellation.

    Use it under ``contextlib.aclosing`` (or let a ``ClosingStreamingResponse`` consume it) so the
    cleanup runs as soon as the consumer stops, not when the generator is garbage-collected.

    Example:
        >>> async with aclosing(iterate_in_thread(engine.stream(ids, params))) as events:  # doctest: +SKIP
        ...     async for event in events:
        ...         print(event.text, end="")
    """
    try:
        for early in taken:
            yield early
        if isinstance(it, RequestStream):
            async for event in _watched(it):
                yield cast(T, event)
            return
        while True:
            item = await anyio.to_thread.run_sync(next, it, _END, limiter=limiter)
            if item is _END:
                return
            yield cast(T, item)
    finally:
        if not (isinstance(it, RequestStream) and it.finished):  # a finished stream holds nothing
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(close_quietly, it, limiter=limiter)


async def _watched(stream: RequestStream) -> AsyncGenerator[Any, None]:
    """An engine stream's events as the engine queues them, taken on the loop without blocking."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()

    def notify() -> None:  # on the engine's thread
        with suppress(RuntimeError):  # the loop closed: nobody is listening any more
            loop.call_soon_threadsafe(ready.set)

    stream.watch(notify)
    while True:
        try:
            event = stream.poll()
        except StopIteration:
            return
        if event is None:
            await ready.wait()
            ready.clear()  # an event queued since is polled next, and its set() wakes a later wait
            continue
        yield event


def close_quietly(it: Iterator[Any]) -> None:
    """Close a blocking iterator that can be closed (cleanup: an error closing it is not the caller's)."""
    # An engine RequestStream cancels on close() whether or not it has started (a queued request
    # is dropped without waiting for its prefill); a Pipeline stream submits nothing before it runs.
    close = getattr(it, "close", None)
    if close is not None:
        with suppress(Exception):
            close()


async def run_until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> tuple[bool, T | None]:
    """Run ``work`` while watching for the client going away; cancel it if it does.

    Returns ``(disconnected, result)``. For non-streamed responses, whose body is sent only at the
    end: a client that hangs up mid-generation still cancels its request.
    """
    result: T | None = None
    error: BaseException | None = None
    gone = False

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                scope.cancel()
                return

    async def run(scope: anyio.CancelScope) -> None:
        nonlocal result, error
        try:
            result = await work()
        except Exception as exc:  # re-raised below, outside the task group (no ExceptionGroup)
            error = exc
        finally:
            scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        tg.start_soon(run, tg.cancel_scope)
    if error is not None:
        raise error
    if gone:
        request.scope["prefixrag.client_gone"] = True
    return gone, result


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always ``aclose()``s its body iterator, however sending ends.

    Starlette cancels the body task when the client disconnects (the iterator sees the cancellation);
    if ``send`` fails instead, the iterator is left suspended at a ``yield``: closing it here runs its
    cleanup now rather than at garbage collection.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            await super().__call__(scope, receive, send)
            completed = True
        finally:
            if not completed or getattr(self, "_gone", False):
                scope["prefixrag.client_gone"] = True
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()

    async def listen_for_disconnect(self, receive: Receive) -> None:
        await super().listen_for_disconnect(receive)
        self._gone = True


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
