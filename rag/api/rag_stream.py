"""/v1/ask's replies from the pipeline's typed results: the JSON body from its ``Answer``, server-sent
events from its ``PipelineEvent``s (``sources``, ``delta``..., ``usage``, ``timings``, ``done``).

Example:
    >>> gen = await Generation.start(services, "ask", lambda: pipeline.stream(question), ANSWER, peek=True)  # doctest: +SKIP
    >>> frames = ask_frames(gen, answer_id=new_id("ans"), model=pipeline.engine.model_id)           # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

import anyio

from rag.api.generation import Generation
from rag.api.schemas.rag import AskUsage, SourceOut, TimingsOut
from rag.api.sse import event, stream_error
from rag.results import Answer, PipelineEvent

log = logging.getLogger(__name__)


async def ask_frames(
    gen: Generation[PipelineEvent, Answer], *, answer_id: str, model: str
) -> AsyncGenerator[str, None]:
    """SSE for /v1/ask: ``event: sources``, ``event: delta``..., ``event: usage``, ``event: timings``
    (every timing the pipeline measures), ``event: done`` (or ``event: error``)."""
    finish = "stop"
    try:
        async with aclosing(gen.events()) as events:
            async for ev in events:
                if ev.type == "sources":
                    yield event(
                        "sources", {"sources": [SourceOut.of(s).model_dump() for s in ev.sources or []]}
                    )
                elif ev.type == "delta":
                    yield event("delta", {"text": ev.text})
                else:  # done: the whole Answer
                    assert ev.answer is not None
                    yield event("usage", AskUsage.of(ev.answer.usage).model_dump())
                    yield event("timings", TimingsOut.of(ev.answer.timings).model_dump())
                    finish = ev.answer.finish_reason
        yield event("done", {"id": answer_id, "model": model, "finish_reason": finish})
    except anyio.get_cancelled_exc_class():
        gen.services.metrics.disconnects.labels(gen.endpoint).inc()
        raise
    except Exception as exc:
        log.warning("ask stream failed: %s", exc)
        yield event("error", stream_error(exc))
