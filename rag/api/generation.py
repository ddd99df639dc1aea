"""Running one request from async routes: admission, its blocking event stream, metrics at its finish.

``Generation`` is the one runner every generating route uses: ``/v1/ask`` runs a pipeline stream
(``PipelineEvent``s ending in an ``Answer``), the OpenAI routes an engine stream (``StreamEvent``s ending
in a ``GenerationResult``). Its ``Outcome`` says which event ends a stream and what that end records.
The stream is opened in a worker thread (a bad request or a full queue is answered with its status,
before any byte is sent), consumed one event per worker-thread call and closed however the request
ends: a client that goes away cancels its generation and releases its cache lock.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
from starlette.requests import Request

from engine.request import GenerationResult, StreamEvent
from rag.api.bridge import close_quietly, iterate_in_thread, run_until_disconnect
from rag.api.errors import InvalidRequest
from rag.api.limits import Admitted
from rag.api.services import Services
from rag.results import Answer, PipelineEvent

E = TypeVar("E")
R = TypeVar("R")


@dataclass(frozen=True)
class Measured:
    """What a finished request adds to the metrics (seconds, tokens)."""

    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    stitched_tokens: int


@dataclass(frozen=True)
class Outcome(Generic[E, R]):
    """How a stream of ``E`` events ends: ``result`` of its last event (None for the others), and
    ``measure``, what that result records."""

    result: Callable[[E], R | None]
    measure: Callable[[R], Measured]


def _measure_result(r: GenerationResult) -> Measured:
    return Measured(
        r.ttft_s, r.total_s, r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.stitched_tokens
    )


def _measure_answer(a: Answer) -> Measured:
    u, t = a.usage, a.timings  # TTFT and total from the question's arrival, retrieval included
    return Measured(
        t.ttft_ms / 1000,
        t.total_ms / 1000,
        u.prompt_tokens,
        u.cached_tokens,
        u.completion_tokens,
        u.stitched_tokens,
    )


ENGINE: Outcome[StreamEvent, GenerationResult] = Outcome(lambda e: e.result, _measure_result)
ANSWER: Outcome[PipelineEvent, Answer] = Outcome(lambda e: e.answer, _measure_answer)


class Generation(Generic[E, R]):
    """One admitted request.

    Example:
        >>> gen = await Generation.start(services, "chat", lambda: engine.stream(ids, params), ENGINE)  # doctest: +SKIP
        >>> result = await gen.collect(request)   # a GenerationResult; None if the client left  # doctest: +SKIP
        >>> async for event in gen.events(): ...  # or streamed                                # doctest: +SKIP
    """

    def __init__(
        self,
        services: Services,
        endpoint: str,
        it: Iterator[E],
        admitted: Admitted,
        outcome: Outcome[E, R],
        head: list[E],
    ) -> None:
        self.services = services
        self.endpoint = endpoint
        self._it = it
        self._admitted = admitted
        self._outcome = outcome
        self._head = head

    @classmethod
    async def start(
        cls,
        services: Services,
        endpoint: str,
        open_stream: Callable[[], Iterator[E]],
        outcome: Outcome[E, R],
        *,
        param: str | None = None,
        peek: bool = False,
    ) -> Generation[E, R]:
        """Admit (429 at the API's cap), open the stream in a worker thread (429 when the engine's queue
        is full; a ``ValueError`` is a 400 naming ``param``) and, with ``peek``, take its first event
        too (a pipeline stream retrieves before its first event: retrieval errors get their status)."""
        admitted = services.admission.enter()

        def begin() -> tuple[Iterator[E], list[E]]:
            it = open_stream()
            try:
                return it, list(itertools.islice(it, 1)) if peek else []
            except BaseException:
                close_quietly(it)
                raise

        try:
            it, head = await anyio.to_thread.run_sync(begin, limiter=services.limiter)
        except ValueError as exc:  # the request's own fault: empty prompt, over the context...
            admitted.release()
            raise InvalidRequest(str(exc), param) from exc
        except BaseException:
            admitted.release()
            raise
        return cls(services, endpoint, it, admitted, outcome, head)

    async def events(self) -> AsyncGenerator[E, None]:
        """The stream's events; the request is cancelled if iteration stops early (client gone)."""
        try:
            stream = iterate_in_thread(self._it, self.services.limiter, taken=self._head)
            async with aclosing(stream) as events:
                async for event in events:
                    yield self._seen(event)
        finally:
            self._admitted.release()

    async def collect(self, request: Request) -> R | None:
        """Run to the end: the last event's result; None when the client disconnected first (its
        request is then cancelled)."""

        async def drain() -> R | None:
            result = None
            async with aclosing(self.events()) as events:
                async for event in events:
                    result = self._outcome.result(event) or result
            return result

        gone, result = await run_until_disconnect(request, drain)
        if gone:
            self.services.metrics.disconnects.labels(self.endpoint).inc()
            return None
        return result

    def _seen(self, event: E) -> E:
        result = self._outcome.result(event)
        if result is not None:
            m = self._outcome.measure(result)
            self.services.metrics.observe_generation(
                self.endpoint,
                ttft_s=m.ttft_s,
                total_s=m.total_s,
                prompt_tokens=m.prompt_tokens,
                cached_tokens=m.cached_tokens,
                completion_tokens=m.completion_tokens,
                stitched_tokens=m.stitched_tokens,
            )
        return event
