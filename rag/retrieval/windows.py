"""A chunk's window vectors: what the embedding reranker scores a question against.

A 256-token chunk is longer than MiniLM reads well, and one sentence can drown in it, so the reranker
looks at overlapping windows of ``window_tokens`` LLM tokens (``window_overlap`` shared), each
prefixed with the chunk's title (``metadata["title"]``), embedded. They are a property of the chunk:
the knowledge base computes them when it indexes the chunk and hands them to the document store with
its vector, as the chunk's extra vector set named ``WindowVectors.set_name`` (``ChunkRecord.extra``;
in memory ``rag.stores.collection.Collection.extra``), so a rerank costs one dot product per window.
The name carries the settings they were computed with: vectors computed with others are never read.

``WindowSource`` is the role the reranker reads them through; ``WindowCache`` is the stand-alone one
(computed on first sight, kept per chunk id), for a reranker used without a knowledge base.

Example:
    >>> windows = WindowVectors(embedder, chunker)                 # doctest: +SKIP
    >>> [v.shape for v in windows.embed(hits)]                     # doctest: +SKIP
    [(4, 384), (1, 384)]
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from rag.ingestion.chunking import Chunker
from rag.retrieval.embedder import Embedder

WINDOW_TOKENS = 96
WINDOW_OVERLAP = 32
WINDOW_SET_PREFIX = "windows:"  # the extra vector sets of a chunk that hold window vectors


class ChunkText(Protocol):
    """What a window needs from a chunk (``Chunk`` and ``ScoredChunk`` fit)."""

    @property
    def chunk_id(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def metadata(self) -> dict[str, Any]: ...


class WindowSource(Protocol):
    """Gives each chunk's window vectors (``[windows, dim]`` unit vectors), in the order asked."""

    def window_vectors(self, chunks: Sequence[ChunkText]) -> list[np.ndarray]: ...


class WindowVectors:
    """Splits chunks into windows and embeds them.

    Example:
        >>> WindowVectors(embedder, chunker).settings                  # doctest: +SKIP
        {'embedder': 'all-minilm-l6-v2', 'window_tokens': 96, 'window_overlap': 32}
    """

    def __init__(
        self,
        embedder: Embedder,
        chunker: Chunker | None = None,
        window_tokens: int = WINDOW_TOKENS,
        window_overlap: int = WINDOW_OVERLAP,
    ) -> None:
        if window_tokens < 1 or not 0 <= window_overlap < window_tokens:
            raise ValueError(
                f"windows need window_tokens >= 1 and 0 <= window_overlap < window_tokens, got "
                f"{window_tokens} and {window_overlap}"
            )
        self.embedder = embedder
        self.splitter = (chunker or Chunker()).resized(window_tokens, window_overlap)
        self.window_tokens, self.window_overlap = window_tokens, window_overlap

    @property
    def settings(self) -> dict[str, Any]:
        """What the vectors depend on besides the chunk (stored with them: other settings, other vectors)."""
        return {
            "embedder": self.embedder.model_name,
            "window_tokens": self.window_tokens,
            "window_overlap": self.window_overlap,
        }

    @property
    def set_name(self) -> str:
        """The name of the chunks' extra vector set these windows are stored under: the settings in
        it, so a set computed with other settings is another set (``window_set_name``)."""
        return window_set_name(self.settings)

    def embed(self, chunks: Sequence[ChunkText], *, show_progress: bool = False) -> list[np.ndarray]:
        """Each chunk's window vectors, embedded in one batch."""
        owners, texts = [], []
        for n, chunk in enumerate(chunks):
            title = chunk.metadata.get("title")
            for start, end in self.splitter.spans(chunk.text) or [(0, len(chunk.text))]:
                owners.append(n)
                texts.append(f"{title}\n\n{chunk.text[start:end]}" if title else chunk.text[start:end])
        if not texts:
            return []
        vectors = self.embedder.embed(texts, show_progress=show_progress)  # [windows, dim]
        index = np.asarray(owners)
        return [vectors[index == n] for n in range(len(chunks))]


def window_set_name(settings: dict[str, Any]) -> str:
    """``WINDOW_SET_PREFIX`` then the settings as compact, sorted JSON.

    Example:
        >>> window_set_name({"embedder": "m", "window_tokens": 96, "window_overlap": 32})
        'windows:{"embedder":"m","window_overlap":32,"window_tokens":96}'
    """
    return WINDOW_SET_PREFIX + json.dumps(settings, sort_keys=True, separators=(",", ":"))


def window_text(chunk: ChunkText) -> tuple[str, object]:
    """What a chunk's window vectors are computed from: another title, other vectors."""
    return chunk.text, chunk.metadata.get("title")


class WindowCache:
    """A ``WindowSource`` that embeds a chunk's windows on first sight and keeps the last
    ``capacity`` chunks' (by chunk id): for a reranker used without a knowledge base.

    Example:
        >>> cache = WindowCache(WindowVectors(embedder, chunker))        # doctest: +SKIP
        >>> cache.window_vectors(hits)[0].shape                          # doctest: +SKIP
        (4, 384)
    """

    def __init__(self, windows: WindowVectors, capacity: int = 4096) -> None:
        self.windows = windows
        self.capacity = capacity
        self._kept: OrderedDict[str, np.ndarray] = OrderedDict()

    def __contains__(self, chunk_id: object) -> bool:
        return chunk_id in self._kept

    def clear(self) -> None:
        self._kept.clear()

    def window_vectors(self, chunks: Sequence[ChunkText]) -> list[np.ndarray]:
        missing = list({c.chunk_id: c for c in chunks if c.chunk_id not in self._kept}.values())
        for chunk, vectors in zip(missing, self.windows.embed(missing), strict=True):
            self._kept[chunk.chunk_id] = vectors
        out = []
        for chunk in chunks:
            self._kept.move_to_end(chunk.chunk_id)
            out.append(self._kept[chunk.chunk_id])
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)
        return out
