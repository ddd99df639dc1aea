"""Chat completions grounded on the caller's documents: the ``rag`` / ``collections`` extension.

The last user message is the query; the chunks it retrieves (only from the collections the caller may
read, or the readable ones it names) are laid out in that message the way /v1/ask lays them out,
``[n] (source: doc)`` passages then ``Question: ...``, and the pipeline's system prompt (which asks for
``[n]`` citations) opens the chat unless the chat brings its own. Earlier turns stay as they were, so
a conversation's prefix still hits the cache.

Example:
    >>> messages, sources = await grounded_chat(services, messages, scope=["alice", "shared"])  # doctest: +SKIP
    >>> messages[-1]["content"][:40], sources[0].doc_id                                        # doctest: +SKIP
    ('[1] (source: notes.md)\\nThe launch code is', 'notes.md')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from rag.api.errors import InvalidRequest
from rag.api.schemas.rag import SourceOut
from rag.api.services import Services
from rag.prompt.assembler import QUESTION_TEMPLATE, SEPARATOR, chunk_body


async def grounded_chat(
    services: Services, messages: list[dict[str, str]], scope: list[str] | None
) -> tuple[list[dict[str, str]], list[SourceOut]]:
    """The chat with retrieved passages in its last user message, and those passages as sources."""
    last = _last_user(messages)
    question = messages[last]["content"]
    if not question.strip():
        raise InvalidRequest("the last user message is empty: nothing to retrieve for", "messages")
    pipeline = services.ready_pipeline()
    hits = await anyio.to_thread.run_sync(
        lambda: pipeline.retrieve(question, collections=scope), limiter=services.limiter
    )
    grounded = [dict(m) for m in messages]
    grounded[last]["content"] = with_passages(question, hits)
    if not any(m["role"] == "system" for m in grounded):
        grounded.insert(0, {"role": "system", "content": pipeline.config.system_prompt})
    sources = [
        SourceOut(doc_id=h.doc_id, chunk_id=h.chunk_id, score=h.score, text=h.text, collection=h.collection)
        for h in hits
    ]
    return grounded, sources


def with_passages(question: str, hits: Sequence[Any]) -> str:
    """``[1] (source: a)\\n...`` passages, then the question (the question alone when nothing matched)."""
    passages = [f"[{n}]{chunk_body(hit)}" for n, hit in enumerate(hits, start=1)]
    return SEPARATOR.join([*passages, QUESTION_TEMPLATE.format(question=question.strip())])


def _last_user(messages: list[dict[str, str]]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            return i
    raise InvalidRequest("retrieval needs a user message to search for", "messages")
