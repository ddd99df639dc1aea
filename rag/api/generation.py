"""Running engine generations from async routes: admission, submit, stream or collect, metrics.

``Generation`` ties one request's pieces together: its admission (released when it ends), the
engine's blocking event iterator (consumed in worker threads, closed however the request ends) and
the metrics observed at the finish.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from typing import Any

import anyio
from starlette.requests import Request

from engine.request import GenerationResult, StreamEvent
from engine.sampling import SamplingParams
from rag.api.bridge import iterate_in_thread, run_until_disconnect
from rag.api.errors import InvalidRequest
from rag.api.limits import Admitted
from rag.api.services import Services


class Generation:
    """One admitted engine request.

    Example:
        >>> gen = await Generation.start(services, "chat", messages, params, namespace="alice")  # doctest: +SKIP
        >>> result = await gen.collect(request)          # non-streamed; None if the client left
        >>> async for event in gen.events(): ...         # or streamed
    """

    def __init__(
        self, services: Services, endpoint: str, it: Iterator[StreamEvent], admitted: Admitted
    ) -> None:
        self.services = services
        self.endpoint = endpoint
        self._it = it
        self._admitted = admitted

    @classmethod
    async def start(
        cls,
        services: Services,
        endpoint: str,
        prompt: Any,
        params: SamplingParams,
        *,
        namespace: str,
    ) -> Generation:
        """Admit (429 when the API cap is reached) and submit (429 when the engine queue is full)."""
        engine = services.ready_engine()
        admitted = services.admission.enter()
        try:
            it = await anyio.to_thread.run_sync(
                lambda: engine.stream(prompt, params, namespace=namespace), limiter=services.limiter
            )
        except ValueError as exc:  # the engine's validation: empty prompt, too long for the context...
            admitted.release()
            raise InvalidRequest(str(exc), "prompt" if "prompt" in str(exc) else None) from exc
        except BaseException:
            admitted.release()
            raise
        return cls(services, endpoint, it, admitted)

    async def events(self) -> AsyncGenerator[StreamEvent, None]:
        """The engine's events; the request is cancelled if iteration stops early (client gone)."""
        try:
            async with aclosing(iterate_in_thread(self._it, self.services.limiter)) as events:
                async for event in events:
                    if event.result is not None:
                        self._observe(event.result)
                    yield event
        finally:
            self._admitted.release()

    async def collect(self, request: Request) -> GenerationResult | None:
        """Run to the end; None when the client disconnected first (its request is then cancelled)."""

        async def drain() -> GenerationResult | None:
            result = None
            async with aclosing(self.events()) as events:
                async for event in events:
                    result = event.result or result
            return result

        gone, result = await run_until_disconnect(request, drain)
        if gone:
            self.services.metrics.disconnects.labels(self.endpoint).inc()
            return None
        return result

    def _observe(self, r: GenerationResult) -> None:
        self.services.metrics.observe_generation(
            self.endpoint,
            ttft_s=r.ttft_s,
            total_s=r.total_s,
            prompt_tokens=r.prompt_tokens,
            cached_tokens=r.cached_tokens,
            completion_tokens=r.completion_tokens,
            stitched_tokens=r.stitched_tokens,
        )
