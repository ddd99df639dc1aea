"""What the assembler produces: a ``Prompt`` (token ids for the engine) made of named ``Segment``s, and
the ``Part``s it is built from.

Example:
    >>> prompt = join_parts([Part("system", True).add("Be brief.", [1, 2]), Part("question", False).add(" Hi", [3])])
    >>> prompt.token_ids, [(s.name, s.start, s.end) for s in prompt.segments], prompt.stable_length
    ([1, 2, 3], [('system', 0, 2), ('question', 2, 3)], 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rag.prompt.order import ChunkLike


@dataclass(frozen=True)
class Segment:
    """A named run of prompt tokens, ``token_ids[start:end]``; ``text`` is what those ids decode to."""

    name: str
    start: int
    end: int
    stable: bool
    text: str = ""

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Prompt:
    """Token ids for the engine plus where each segment lies in them.

    ``stable_length``: tokens of the prefix that is identical for every prompt of this assembler.
    ``chunk_ids`` / ``chunks``: the chunks used, in prompt order (``[n]`` cites ``chunks[n - 1]``).
    ``dropped_chunk_ids``: chunks left out to fit the context budget, best-ranked first.
    ``chunk_spans``: ``token_ids[start:end]`` of each chunk's body (its ``[n]`` marker excluded), in
    prompt order: what the engine's ``chunks`` reuse mode stitches (a body's ids are the same wherever
    it stands; everything before the first body is the prefix each chunk is cached after).
    ``chunk_context``: what stands between that prefix and a reused chunk where the engine computes
    its KV (the engine's ``chunk_context``; ``rag.prompt.stand_in``).
    """

    token_ids: list[int]
    segments: list[Segment]
    stable_length: int = 0
    chunk_ids: list[str] = field(default_factory=list)
    dropped_chunk_ids: list[str] = field(default_factory=list)
    chunks: list[ChunkLike] = field(default_factory=list)
    chunk_spans: list[tuple[int, int]] = field(default_factory=list)
    chunk_context: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(seg.text for seg in self.segments)

    def __len__(self) -> int:
        return len(self.token_ids)

    def stitch_args(self) -> dict[str, Any]:
        """The engine's keyword arguments for stitching this prompt's chunks (``reuse="chunks"``)."""
        return {"chunk_spans": self.chunk_spans, "chunk_context": self.chunk_context}


@dataclass
class Part:
    """A segment under construction: its pieces' ids and text."""

    name: str
    stable: bool
    ids: list[int] = field(default_factory=list)
    text: str = ""
    body_start: int | None = None  # a chunk part: where its body's ids begin (after the marker)

    def add(self, text: str, ids: list[int]) -> Part:
        self.text += text
        self.ids += ids
        return self


def join_parts(
    parts: list[Part],
    chunks: list[ChunkLike] | None = None,
    dropped: list[str] | None = None,
    chunk_context: list[int] | None = None,
) -> Prompt:
    """The prompt the parts make, in order; ``chunks`` are the ones their chunk parts hold."""
    ids: list[int] = []
    segments = []
    spans = []
    for part in parts:
        segments.append(Segment(part.name, len(ids), len(ids) + len(part.ids), part.stable, part.text))
        if part.body_start is not None:
            spans.append((len(ids) + part.body_start, len(ids) + len(part.ids)))
        ids += part.ids
    stable = max((s.end for s in segments if s.stable), default=0)
    chunks = chunks or []
    return Prompt(
        token_ids=ids,
        segments=segments,
        stable_length=stable,
        chunk_ids=[str(c.chunk_id) for c in chunks],
        dropped_chunk_ids=dropped or [],
        chunks=chunks,
        chunk_spans=spans,
        chunk_context=list(chunk_context or []),
    )
