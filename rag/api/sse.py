"""Server-sent events: OpenAI's ``data: {...}\\n\\n`` frames, ``data: [DONE]``, and named events."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import anyio

from engine.request import EngineError, QueueFullError
from rag.api.errors import error_body, generation_failed
from rag.api.generation import Generation
from rag.api.schemas.openai import (
    ChatChunkChoice,
    ChatCompletionChunk,
    Completion,
    CompletionChoice,
    Delta,
    Usage,
    finish_reason,
)
from rag.api.schemas.rag import SourceOut

DONE = "data: [DONE]\n\n"


def data(payload: Any) -> str:
    """One SSE frame carrying JSON."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def event(name: str, payload: Any) -> str:
    """A named SSE event (``event: sources``), for the RAG stream."""
    return f"event: {name}\n{data(payload)}"


def stream_error(exc: BaseException) -> dict[str, Any]:
    """The error object sent in-band once a stream has started (its status is already 200)."""
    if isinstance(exc, QueueFullError):
        return error_body(429, str(exc), code="queue_full")
    if isinstance(exc, ValueError):
        return error_body(400, str(exc), code="invalid_value")
    if isinstance(exc, EngineError):
        return error_body(500, generation_failed(exc), code="engine_error")
    return error_body(500, "internal server error (see the server log)", code="internal_error")


async def guarded(
    frames: AsyncIterator[str], gen: Generation, on_error: Callable[[BaseException], list[str]]
) -> AsyncGenerator[str, None]:
    """Pass frames through; an error mid-stream becomes in-band frames; a disconnect is counted."""
    try:
        async for frame in frames:
            yield frame
    except anyio.get_cancelled_exc_class():
        gen.services.metrics.disconnects.labels(gen.endpoint).inc()
        raise
    except Exception as exc:
        for frame in on_error(exc):
            yield frame


async def chat_frames(
    gen: Generation,
    *,
    chunk_id: str,
    created: int,
    model: str,
    include_usage: bool,
    sources: list[SourceOut] | None = None,
) -> AsyncGenerator[str, None]:
    """OpenAI chat.completion.chunk frames: the first token's content with the role (and ``sources``
    for a rag chat), content deltas, finish, [usage: empty choices], [DONE]. Nothing is sent before
    the first token exists, so a client's first chunk marks its time to first token."""

    def chunk(
        delta: Delta | None,
        finish: str | None = None,
        usage: Usage | None = None,
        sources: list[SourceOut] | None = None,
    ) -> str:
        choices = [] if delta is None else [ChatChunkChoice(delta=delta, finish_reason=finish)]
        body = ChatCompletionChunk(
            id=chunk_id, created=created, model=model, choices=choices, usage=usage, sources=sources
        )
        leave_out = ({"usage"} if not include_usage else set()) | ({"sources"} if sources is None else set())
        return data(body.model_dump(exclude=leave_out))

    first = True
    async for ev in gen.events():
        if first:  # the role rides with the first token: tools time the first chunk as TTFT
            yield chunk(Delta(role="assistant", content=ev.text), sources=sources)
            first = False
        elif ev.text:
            yield chunk(Delta(content=ev.text))
        if ev.result is not None:
            yield chunk(Delta(), finish=finish_reason(ev.finish_reason))
            if include_usage:
                r = ev.result
                yield chunk(None, usage=Usage.of_result(r))
    yield DONE


async def completion_frames(
    gen: Generation, *, chunk_id: str, created: int, model: str, include_usage: bool
) -> AsyncGenerator[str, None]:
    """OpenAI text_completion frames: the first token's text (at its time, also when empty), text
    deltas, finish, [usage: empty choices], [DONE]."""

    def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        body = Completion(id=chunk_id, created=created, model=model, choices=choices, usage=usage)
        return data(body.model_dump(exclude={"usage"} if not include_usage else set()))

    first = True
    async for ev in gen.events():
        if ev.text or first:  # the first token's chunk goes out even while its text is held back
            yield chunk([CompletionChoice(text=ev.text)])
            first = False
        if ev.result is not None:
            yield chunk([CompletionChoice(text="", finish_reason=finish_reason(ev.finish_reason))])
            if include_usage:
                r = ev.result
                yield chunk([], usage=Usage.of_result(r))
    yield DONE


def openai_error_frames(exc: BaseException) -> list[str]:
    return [data(stream_error(exc)), DONE]
