"""Running ``Pipeline.stream`` from async routes: admission, worker threads, SSE frames, the Answer.

The pipeline's stream yields, in order: the sources, text deltas, then usage and timings. Its
blocking iterator is consumed one event per worker-thread call (``iterate_in_thread``) and closed
however the request ends, which closes the engine stream inside it: a client that goes away cancels
its generation and releases its cache lock.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from dataclasses import asdict, is_dataclass
from typing import Any

import anyio
from starlette.requests import Request

from rag.api.bridge import iterate_in_thread, run_until_disconnect
from rag.api.errors import InvalidRequest
from rag.api.limits import Admitted
from rag.api.schemas.openai import new_id
from rag.api.schemas.rag import AskResponse, AskUsage, SourceOut, TimingsOut
from rag.api.services import Services
from rag.api.sse import event, stream_error

log = logging.getLogger(__name__)


class AskRun:
    """One admitted question.

    Example:
        >>> run = await AskRun.start(services, pipeline, "Who?", top_k=4, max_tokens=None, namespace="alice")  # doctest: +SKIP
        >>> answer = await run.collect(request)      # an AskResponse, or None if the client left
    """

    def __init__(
        self, services: Services, model: str, it: Iterator[Any], admitted: Admitted, first: Any
    ) -> None:
        self.services = services
        self.id = new_id("ans")
        self.model = model
        self._it = it
        self._admitted = admitted
        self._first = first
        self.text: list[str] = []
        self.sources: list[SourceOut] = []
        self.usage: AskUsage | None = None
        self.timings: TimingsOut | None = None
        self.finish_reason = "stop"

    @classmethod
    async def start(
        cls,
        services: Services,
        pipeline: Any,
        question: str,
        *,
        top_k: int | None,
        max_tokens: int | None,
        namespace: str,
        collections: list[str] | None = None,
        reuse: str | None = None,
    ) -> AskRun:
        """Admit, start the pipeline stream and take its first event (the sources), so that retrieval
        errors and a full queue are answered with their status rather than in-band. Retrieval reads
        only ``collections`` (None: every collection)."""
        params = pipeline.config.sampling_params(max_tokens=max_tokens)  # the pipeline's, one cap replaced
        kwargs: dict[str, Any] = {
            "top_k": top_k,
            "namespace": namespace,
            "params": params,
            "collections": collections,
        }
        if reuse is not None:
            kwargs["reuse"] = reuse
        admitted = services.admission.enter()

        def begin() -> tuple[Iterator[Any], Any]:
            it = iter(pipeline.stream(question, **kwargs))
            try:
                return it, next(it, None)
            except BaseException:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
                raise

        try:
            it, first = await anyio.to_thread.run_sync(begin, limiter=services.limiter)
        except ValueError as exc:
            admitted.release()
            raise InvalidRequest(str(exc)) from exc
        except BaseException:
            admitted.release()
            raise
        model = getattr(getattr(pipeline, "engine", None), "model_id", "") or ""
        return cls(services, model, it, admitted, first)

    async def events(self) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """Normalized ``(kind, payload)`` events: sources, delta, usage, timings."""
        try:
            if self._first is not None:
                for item in self._absorb(self._first):
                    yield item
            async with aclosing(iterate_in_thread(self._it, self.services.limiter)) as events:
                async for raw in events:
                    for item in self._absorb(raw):
                        yield item
            self._observe()
        finally:
            self._admitted.release()

    async def collect(self, request: Request) -> AskResponse | None:
        async def drain() -> AskResponse:
            async with aclosing(self.events()) as events:
                async for _ in events:
                    pass
            return self.answer()

        gone, answer = await run_until_disconnect(request, drain)
        if gone:
            self.services.metrics.disconnects.labels("ask").inc()
            return None
        return answer

    def answer(self) -> AskResponse:
        return AskResponse(
            id=self.id,
            model=self.model,
            text="".join(self.text),
            sources=self.sources,
            usage=self.usage
            or AskUsage(prompt_tokens=0, cached_tokens=0, completion_tokens=0, total_tokens=0),
            timings=self.timings or TimingsOut(retrieve_ms=0, rerank_ms=0, ttft_ms=0, total_ms=0),
            finish_reason=self.finish_reason,
        )

    # ---- the pipeline's events -> (kind, payload) ---------------------------------------------
    def _absorb(self, raw: Any) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        kind, payload = _normalize(raw)
        if kind == "sources":
            self.sources = [SourceOut.model_validate(_plain(s)) for s in payload.get("sources", [])]
            out.append(("sources", {"sources": [s.model_dump() for s in self.sources]}))
        elif kind == "delta":
            text = str(payload.get("text", ""))
            if text:
                self.text.append(text)
                out.append(("delta", {"text": text}))
        elif kind == "usage":
            self._usage(payload)
            out.append(("usage", self.usage.model_dump() if self.usage else {}))
        elif kind == "timings":
            self.timings = TimingsOut.model_validate(payload)
            out.append(("timings", self.timings.model_dump()))
        elif kind == "done":  # the final event carries the whole Answer: usage and timings from it
            answer = payload.get("answer") or {}
            if answer.get("usage"):
                self._usage(answer["usage"])
                out.append(("usage", self.usage.model_dump() if self.usage else {}))
            if answer.get("timings"):
                self.timings = TimingsOut.model_validate(answer["timings"])
                out.append(("timings", self.timings.model_dump()))
            self.finish_reason = str(answer.get("finish_reason") or "stop")
        return out

    def _usage(self, u: dict[str, Any]) -> None:
        prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
        self.usage = AskUsage(
            prompt_tokens=prompt,
            cached_tokens=int(u.get("cached_tokens", 0)),
            completion_tokens=completion,
            total_tokens=prompt + completion,
            stitched_tokens=int(u.get("stitched_tokens", 0)),
            recomputed_tokens=int(u.get("recomputed_tokens", 0)),
            stitch_deviation=u.get("stitch_deviation"),
            reuse=str(u.get("reuse", "prefix")),
        )

    def _observe(self) -> None:
        if self.usage is None or self.timings is None:
            return
        self.services.metrics.observe_generation(
            "ask",
            ttft_s=self.timings.ttft_ms / 1000,
            total_s=self.timings.total_ms / 1000,
            prompt_tokens=self.usage.prompt_tokens,
            cached_tokens=self.usage.cached_tokens,
            completion_tokens=self.usage.completion_tokens,
            stitched_tokens=self.usage.stitched_tokens,
        )


async def ask_frames(run: AskRun) -> AsyncGenerator[str, None]:
    """SSE for /v1/ask: ``event: sources``, ``event: delta``..., ``event: usage``, ``event: timings``,
    ``event: done`` (or ``event: error``)."""
    try:
        async with aclosing(run.events()) as events:
            async for kind, payload in events:
                yield event(kind, payload)
        yield event("done", {"id": run.id, "model": run.model, "finish_reason": run.finish_reason})
    except anyio.get_cancelled_exc_class():
        run.services.metrics.disconnects.labels("ask").inc()
        raise
    except Exception as exc:
        log.warning("ask stream failed: %s", exc)
        yield event("error", stream_error(exc))


def _normalize(raw: Any) -> tuple[str, dict[str, Any]]:
    """The pipeline's stream event as ``(kind, payload)``."""
    data = _plain(raw)
    if not isinstance(data, dict):
        return "delta", {"text": str(data)}
    kind = str(data.get("type") or data.get("kind") or data.get("event") or "")
    return kind, data


def _plain(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    return obj
