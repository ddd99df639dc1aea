"""Token ids of each benchmark request for one configuration (one engine, one chunk order).

A RAG turn goes through the pipeline's prompt assembler (stable prefix, chunks in the configured
order, question). A follow-up turn appends the previous answer and the new question to the
conversation's previous prompt, each piece tokenized on its own as the assembler does, so the
whole history is a cached prefix when the cache still holds it.

Example:
    >>> builder = PromptBuilder(pipeline.assemble, ChatLayout(tokenizer))      # doctest: +SKIP
    >>> ids = builder.prompt(request)                                           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rag.benchmark.workload import BenchRequest
from rag.prompt.assembler import CHUNK_SEGMENT, Prompt
from rag.prompt.template import ChatLayout
from rag.types import ScoredChunk

Assemble = Callable[[str, Sequence[ScoredChunk], str], Prompt]
"""(question, hits, namespace) -> Prompt: ``Pipeline.assemble`` or an equivalent."""


class PromptBuilder:
    """Builds each request's token ids, remembering every conversation's latest prompt.

    Example:
        >>> builder = PromptBuilder(pipeline.assemble, ChatLayout(pipeline.engine.tokenizer))  # doctest: +SKIP
        >>> [len(builder.prompt(r)) for r in workload.requests]                                # doctest: +SKIP
    """

    def __init__(self, assemble: Assemble, layout: ChatLayout) -> None:
        self.assemble = assemble
        self.layout = layout
        self._history: dict[int, list[int]] = {}
        self.last_boundary = 0  # reusing this many tokens of the last prompt means reusing context
        pieces = layout.scaffold(("system", "user", "assistant", "user"))
        self._to_user = layout.encode(pieces[3], content=False)  # after an assistant message
        self._to_answer = layout.encode(pieces[4], content=False)  # the generation prompt

    def prompt(self, request: BenchRequest) -> list[int]:
        """The request's token ids; a follow-up needs its conversation's earlier turns built first."""
        if request.turn == 0:
            prompt = self.assemble(request.question, request.hits, request.tenant)
            ids = list(prompt.token_ids)
            chunks = [s.end for s in prompt.segments if s.name.startswith(CHUNK_SEGMENT)]
            self.last_boundary = chunks[0] if chunks else len(ids)  # the first retrieved chunk, whole
        else:
            previous = self._history.get(request.conversation)
            if previous is None:
                raise ValueError(
                    f"request {request.index} follows up conversation {request.conversation}, "
                    "whose first turn was not built"
                )
            ids = [
                *previous,
                *self.layout.encode(request.previous_answer),
                *self._to_user,
                *self.layout.encode(request.question),
                *self._to_answer,
            ]
            self.last_boundary = len(previous)  # the whole earlier conversation
        self._history[request.conversation] = ids
        return ids
