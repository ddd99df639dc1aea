"""Chat completions grounded on the caller's documents: the ``rag`` / ``collections`` extension.

The last user message is the query. The pipeline grounds the chat as it grounds a /v1/ask question
(``Pipeline.ground_chat``): the chunks it retrieves (only from the collections the caller may read, or
the readable ones it names) go into that message in the assembler's layout, cache-aware order and
budget, before ``Question: ...``; a chat without a system message of its own opens with the pipeline's
stable prefix (its system prompt asks for ``[n]`` citations), so a one-message chat reads exactly the
prompt /v1/ask reads. Earlier turns are tokenized one by one, so a conversation's prefix still hits
the cache. The sources are scored as /v1/ask scores them (question-chunk cosine similarity).

Example:
    >>> chat = GroundedChat(pipeline, messages, params, namespace="alice", scope=["alice", "shared"])  # doctest: +SKIP
    >>> gen = await Generation.start(services, "chat", chat, ENGINE, param="messages")                 # doctest: +SKIP
    >>> chat.sources[0].doc_id                                                                         # doctest: +SKIP
    'notes.md'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.backend import EventStream
from engine.sampling import SamplingParams
from rag.api.schemas.rag import SourceOut
from rag.pipeline import Pipeline
from rag.results import Grounded


class GroundedChat:
    """Opens a grounded chat's engine stream (called in the runner's worker thread: retrieval runs
    under the request's admission) and keeps what grounded it."""

    def __init__(
        self,
        pipeline: Pipeline,
        messages: Sequence[Mapping[str, str]],
        params: SamplingParams,
        *,
        namespace: str,
        scope: list[str] | None,
    ) -> None:
        self.pipeline = pipeline
        self.messages = messages
        self.params = params
        self.namespace = namespace
        self.scope = scope
        self.grounded: Grounded | None = None

    def __call__(self) -> EventStream:
        self.grounded = self.pipeline.ground_chat(
            self.messages, namespace=self.namespace, collections=self.scope
        )
        return self.pipeline.stream_grounded(self.grounded, self.params)

    @property
    def sources(self) -> list[SourceOut]:
        """The passages the reply is grounded on ([n] cites the n-th), once the stream is open."""
        assert self.grounded is not None, "the chat is grounded when its stream opens"
        return [SourceOut.of(s) for s in self.grounded.sources]
