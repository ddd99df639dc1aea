"""What the pipeline hands out: a ``Grounded`` prompt (retrieval and assembly done), then an ``Answer``
with its ``Source``s, ``Usage`` and ``Timings``; ``Pipeline.stream`` yields ``PipelineEvent``s.

Example:
    >>> answer = pipeline.ask("What is the Zorblax code?")                    # doctest: +SKIP
    >>> answer.sources[0].score, answer.usage.cached_tokens, answer.timings.ttft_ms   # doctest: +SKIP
    (0.61, 402, 98.4)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from engine.request import GenerationResult
from rag.prompt.prompt import Prompt
from rag.types import DEFAULT_COLLECTION


@dataclass(frozen=True)
class Source:
    """A chunk the answer may cite: ``[n]`` in the text refers to ``sources[n - 1]``.

    ``score`` is the cosine similarity of the question's and the chunk's embeddings, in [-1, 1] (higher
    is closer): the same measure whatever retrieval mode, fusion or reranker picked the chunk and
    however many candidates there were. Sources are listed in prompt order, not by score.
    """

    doc_id: str
    chunk_id: str
    score: float
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class Usage:
    """Token counts. ``cached_tokens``: the exact prefix reused; ``stitched_tokens``: prompt tokens whose
    KV came from cached chunks at other positions (``reuse="chunks"``), of which ``recomputed_tokens``
    were computed again so the chunks see each other; ``reuse``: the mode that served the request;
    ``stitch_deviation``: the engine's estimate of how far a stitched prompt was from exact, 0 to 1
    (the share of the question's attention on chunk KV left stitched; None when nothing was)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    stitched_tokens: int = 0
    recomputed_tokens: int = 0
    reuse: str = "prefix"
    stitch_deviation: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, result: GenerationResult) -> Usage:
        """The token counts of the engine's result."""
        return cls(
            result.prompt_tokens,
            result.cached_tokens,
            result.completion_tokens,
            result.stitched_tokens,
            result.recomputed_tokens,
            result.reuse,
            result.stitch_deviation,
        )


@dataclass(frozen=True)
class Timings:
    """Milliseconds (every field; the engine's ``GenerationResult`` reports seconds, ``*_s``).

    ``ttft_ms``: from the question to the first answer token (retrieval included); ``prefill_ms``: the
    engine's share of it (queue + prefill of the uncached suffix)."""

    retrieve_ms: float
    rerank_ms: float
    ttft_ms: float
    total_ms: float
    assemble_ms: float = 0.0
    prefill_ms: float = 0.0


@dataclass(frozen=True)
class Answer:
    """A grounded answer with its citations, token usage and where the time went."""

    text: str
    sources: list[Source]
    usage: Usage
    timings: Timings
    finish_reason: str = "stop"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PipelineEvent:
    """One step of ``Pipeline.stream``: ``sources`` first, then ``delta`` text, then ``done`` (answer)."""

    type: Literal["sources", "delta", "done"]
    text: str = ""
    sources: list[Source] | None = None
    answer: Answer | None = None


@dataclass(frozen=True)
class Grounded:
    """A question (or chat) grounded on retrieved chunks, before generation: the prompt the engine
    will read, the sources it cites, the tenant namespace it was assembled for (the ``cache`` order
    asked that namespace's cache) and what retrieval and assembly took.

    ``started``: ``time.perf_counter()`` when the question arrived (TTFT and total count from it).
    """

    prompt: Prompt
    sources: list[Source]
    namespace: str
    started: float
    retrieve_ms: float = 0.0
    rerank_ms: float = 0.0
    assemble_ms: float = 0.0
