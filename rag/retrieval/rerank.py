"""Second-stage reranking of first-stage hits.

- ``Reranker``: the role (a ``typing.Protocol``): ``rerank(query, hits, top_k) -> list[ScoredChunk]``.
- ``NoReranker``: keeps the first-stage order (the measured default; ``prefixrag eval-retrieval``).
- ``EmbeddingReranker``: needs no extra model. It scores each candidate by its best window
  (``rag.retrieval.windows``: overlapping windows of ``window_tokens``, since a 256-token chunk is
  longer than MiniLM reads and one sentence can drown in it) and fuses that cosine with the
  first-stage score. A knowledge base computes the window vectors at ingestion and hands them over.
- ``CrossEncoderReranker``: a sentence-transformers ``CrossEncoder`` from any local directory.

Example:
    >>> reranker = EmbeddingReranker(embedder, chunker)           # doctest: +SKIP
    >>> reranker.rerank("what does pass do?", hits, top_k=4)      # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rag.ingestion.chunking import Chunker
from rag.query import check_top_k
from rag.retrieval.embedder import Embedder, _hub_offline
from rag.retrieval.windows import WINDOW_OVERLAP, WINDOW_TOKENS, WindowCache, WindowSource, WindowVectors
from rag.types import ScoredChunk

# The window score's share in the fused score, chosen with the candidate count (RAGConfig) on the
# retrieval set's tune split only.
RERANK_WEIGHT = 0.2


@runtime_checkable
class Reranker(Protocol):
    """Reorders first-stage hits for a query and keeps the best ``top_k``."""

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_k: int) -> list[ScoredChunk]: ...


def _minmax(values: np.ndarray) -> np.ndarray:
    span = float(values.max() - values.min()) if len(values) else 0.0
    return (values - values.min()) / span if span > 0 else np.zeros_like(values)


class NoReranker:
    """Keeps the first-stage order: ``hits[:top_k]``.

    Example:
        >>> NoReranker().rerank("q", [], top_k=3)
        []
    """

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_k: int) -> list[ScoredChunk]:
        check_top_k(top_k)
        return list(hits[:top_k])


class EmbeddingReranker:
    """Re-scores hits by their best-matching window, fused with the first-stage score.

    ``score = (1 - weight) * minmax(first-stage score) + weight * minmax(best window cosine)``,
    normalised over the candidate list. The windows (``rag.retrieval.windows``) come from ``source``:
    a knowledge base gives the ones it computed at ingestion (the rerank is then a dot product);
    without one they are embedded on first sight and kept per chunk id (``WindowCache``).

    Example:
        >>> reranker = EmbeddingReranker(Embedder(), Chunker(), weight=0.2)   # doctest: +SKIP
        >>> [h.chunk_id for h in reranker.rerank(query, hits, top_k=4)]      # doctest: +SKIP
    """

    def __init__(
        self,
        embedder: Embedder,
        chunker: Chunker | None = None,
        weight: float = RERANK_WEIGHT,
        window_tokens: int = WINDOW_TOKENS,
        window_overlap: int = WINDOW_OVERLAP,
        cache_size: int = 4096,
        source: WindowSource | None = None,
    ) -> None:
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight must be in [0, 1], got {weight}")
        self.embedder = embedder
        self.weight = weight
        self.windows = WindowVectors(embedder, chunker, window_tokens, window_overlap)
        self.source: WindowSource = source or WindowCache(self.windows, cache_size)

    def clear_cache(self) -> None:
        """Forget the window vectors the reranker embedded itself (a knowledge base's stay)."""
        if isinstance(self.source, WindowCache):
            self.source.clear()

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_k: int) -> list[ScoredChunk]:
        check_top_k(top_k)
        if len(hits) <= 1:
            return list(hits[:top_k])
        q = self.embedder.embed_query(query)  # [dim]
        window_best = np.array([float((v @ q).max()) for v in self.source.window_vectors(hits)])
        first = np.array([h.score for h in hits])
        fused = (1 - self.weight) * _minmax(first) + self.weight * _minmax(window_best)
        order = np.argsort(-fused, kind="stable")[:top_k]
        return [hits[i].model_copy(update={"score": float(fused[i])}) for i in order.tolist()]


class CrossEncoderReranker:
    """Scores (query, chunk) pairs with a sentence-transformers CrossEncoder from a local directory.

    The model is loaded with the Hugging Face hub forced offline (nothing is downloaded).

    Example:
        >>> reranker = CrossEncoderReranker("/models/ms-marco-MiniLM-L-6-v2")   # doctest: +SKIP
        >>> reranker.rerank("what does pass do?", hits, top_k=4)[0].score      # doctest: +SKIP
        8.91
    """

    def __init__(self, model_path: str | os.PathLike[str], batch_size: int = 16, device: str = "cpu") -> None:
        path = Path(model_path).expanduser()
        if not path.is_dir():
            raise ValueError(f"cross-encoder model_path {str(model_path)!r} is not a local model directory")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self.path, self.batch_size, self.device = path.resolve(), batch_size, device
        self._model: Any = None

    def warm_up(self) -> None:
        """Load the model (idempotent)."""
        if self._model is None:
            from sentence_transformers import CrossEncoder

            with _hub_offline():
                self._model = CrossEncoder(str(self.path), device=self.device, local_files_only=True)

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_k: int) -> list[ScoredChunk]:
        check_top_k(top_k)
        if not hits:
            return []
        self.warm_up()
        pairs = [(query, h.text) for h in hits]
        scores = np.asarray(self._model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False))
        scores = scores.reshape(len(hits), -1)[:, -1]  # one logit per pair (last column if several)
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [hits[i].model_copy(update={"score": float(scores[i])}) for i in order.tolist()]
