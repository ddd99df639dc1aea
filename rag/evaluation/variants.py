"""Other ways to embed one knowledge base's chunks, for measuring the default against them.

The knowledge base holds one vector per chunk: its search text (title + chunk) with long texts
windowed and mean-pooled. Built from the same chunks and the same embedder:

- ``truncated``: long search texts embedded as the model alone does, cut at its window;
- ``multi-vector``: one vector per window, searched by the best window (max-sim);
- ``plain``: the chunk text alone (no title), truncated: MiniLM + FAISS with nothing added;
- ``words_only_bm25``: the BM25 index without operator tokens.

Chunks that fit the model's window keep the stored vector in the first two (their embedding
is the same either way), so only long chunks are embedded again.

Example:
    >>> parts = kb_parts(kb)                                            # doctest: +SKIP
    >>> index = truncated_index(parts, kb.search_text)                  # doctest: +SKIP
    >>> len(index) == len(parts.index)                                  # doctest: +SKIP
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from rag.knowledge_base import KnowledgeBase
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.diversity import DiverseRetriever
from rag.retrieval.embedder import Embedder
from rag.retrieval.index import VectorIndex
from rag.retrieval.retriever import HybridRetriever
from rag.types import Chunk

SearchText = Callable[[Chunk], str]


@dataclass(frozen=True)
class KBParts:
    """The components a knowledge base searches with.

    Example:
        >>> parts = kb_parts(kb)                               # doctest: +SKIP
        >>> len(parts.index) == len(parts.chunks)              # doctest: +SKIP
        True
    """

    embedder: Embedder
    index: VectorIndex
    bm25: BM25Index
    chunks: Mapping[str, Chunk]


def kb_parts(kb: KnowledgeBase) -> KBParts:
    """A knowledge base's embedder, vector index, BM25 index and chunk map (shared, not copied)."""
    retriever = kb.retriever("hybrid", fusion="weighted")
    hybrid = retriever.inner if isinstance(retriever, DiverseRetriever) else retriever
    assert isinstance(hybrid, HybridRetriever)
    index, bm25 = hybrid.dense.index, hybrid.lexical.bm25
    if not isinstance(index, VectorIndex) or not isinstance(bm25, BM25Index):
        raise ValueError("retrieval variants are compared on a knowledge base of one collection")
    return KBParts(kb.embedder, index, bm25, hybrid.dense.chunks)


def long_chunk_ids(parts: KBParts, search_text: SearchText) -> list[str]:
    """Ids of the chunks whose search text is longer than the embedder's window."""
    return [cid for cid, c in parts.chunks.items() if len(parts.embedder.window_spans(search_text(c))) > 1]


def truncated_index(parts: KBParts, search_text: SearchText, *, show_progress: bool = False) -> VectorIndex:
    """The index with every long chunk embedded truncated."""
    long = long_chunk_ids(parts, search_text)
    texts = [search_text(parts.chunks[cid]) for cid in long]
    vectors = parts.embedder.embed(texts, long_texts="truncate", show_progress=show_progress)
    return _replaced(parts, dict(zip(long, vectors, strict=True)))


def multi_vector_index(
    parts: KBParts, search_text: SearchText, *, show_progress: bool = False
) -> VectorIndex:
    """The index with one vector per window of every long chunk (search keeps each chunk's best)."""
    long = long_chunk_ids(parts, search_text)
    texts = [search_text(parts.chunks[cid]) for cid in long]
    vectors, owners = parts.embedder.embed_windows(texts, show_progress=show_progress)
    index = _replaced(parts, {})
    index.delete(long)
    index.add([long[i] for i in owners.tolist()], vectors)
    return index


def plain_index(parts: KBParts, *, show_progress: bool = False) -> VectorIndex:
    """Every chunk's own text (no title) embedded truncated: the plain MiniLM + FAISS baseline."""
    ids = list(parts.chunks)
    texts = [parts.chunks[cid].text for cid in ids]
    vectors = parts.embedder.embed(texts, long_texts="truncate", show_progress=show_progress)
    index = VectorIndex(parts.index.dim, kind="flat")
    index.add(ids, vectors)
    return index


def words_only_bm25(parts: KBParts, search_text: SearchText) -> BM25Index:
    """The BM25 index over the same search texts with words only (no operator tokens)."""
    bm25 = BM25Index(parts.bm25.k1, parts.bm25.b, parts.bm25.stemming, operators=False)
    ids = list(parts.chunks)
    bm25.add(ids, [search_text(parts.chunks[cid]) for cid in ids])
    return bm25


def _replaced(parts: KBParts, vectors: Mapping[str, np.ndarray]) -> VectorIndex:
    """A flat copy of the stored index, ``vectors[cid]`` in place of the stored vector where given."""
    ids = list(parts.chunks)
    rows = [vectors[cid] if cid in vectors else parts.index.vectors_of(cid)[0] for cid in ids]
    index = VectorIndex(parts.index.dim, kind="flat")
    index.add(ids, np.stack(rows) if rows else np.zeros((0, parts.index.dim), dtype=np.float32))
    return index
