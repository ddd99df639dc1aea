"""Diversity: at most a few chunks per document at the top of a result list.

Neighbouring chunks of one long document often score alike, so a plain top-k can spend most of
its slots (and the prompt's tokens) on one document while another relevant one just misses the
cut. ``cap_per_document`` keeps each document's best ``per_document`` hits first, in score order,
then fills any slots left with the best of the hits it skipped, so a knowledge base with a single
document still gets ``top_k`` chunks. ``DiverseRetriever`` applies it to any retriever, fetching
deeper until the cap can be met or the retriever runs out.

Example:
    >>> from rag.types import ScoredChunk
    >>> hits = [ScoredChunk(doc_id=d, chunk_id=f"{d}{i}", score=s, text="")
    ...         for i, (d, s) in enumerate([("a", 0.9), ("a", 0.8), ("b", 0.7), ("a", 0.6)])]
    >>> [h.chunk_id for h in cap_per_document(hits, per_document=1, top_k=3)]
    ['a0', 'b2', 'a1']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rag.query import Query
from rag.retrieval.retriever import QueryRetriever
from rag.types import ScoredChunk

_FETCH_FACTOR = 4  # first fetch: this many times top_k
_MAX_FETCH_FACTOR = 32  # give up deepening at this many times top_k


def cap_per_document(hits: Sequence[ScoredChunk], per_document: int, top_k: int) -> list[ScoredChunk]:
    """Up to ``top_k`` hits, at most ``per_document`` per document first, then the best skipped ones."""
    if per_document <= 0:
        raise ValueError(f"per_document must be > 0, got {per_document}")
    kept, skipped = _within_cap(hits, per_document, top_k)
    return kept + skipped[: top_k - len(kept)]


class DiverseRetriever:
    """Wraps a retriever so that no document holds more than ``per_document`` of the top slots
    while other documents have hits to offer.

    Example:
        >>> diverse = DiverseRetriever(hybrid, per_document=1)               # doctest: +SKIP
        >>> len({h.doc_id for h in diverse.retrieve("what does pass do?", 4)})  # doctest: +SKIP
        4
    """

    def __init__(self, inner: QueryRetriever, per_document: int = 1) -> None:
        if per_document <= 0:
            raise ValueError(f"per_document must be > 0, got {per_document}")
        self.inner, self.per_document = inner, per_document

    def retrieve(self, query: str, top_k: int) -> list[ScoredChunk]:
        return self.search(Query.of(query, top_k))

    def search(self, query: Query) -> list[ScoredChunk]:
        top_k = query.top_k
        fetch = _FETCH_FACTOR * top_k
        while True:
            hits = self.inner.search(query.deeper(fetch))
            kept, skipped = _within_cap(hits, self.per_document, top_k)
            exhausted = len(hits) < fetch or fetch >= _MAX_FETCH_FACTOR * top_k
            if len(kept) == top_k or exhausted:
                return kept + skipped[: top_k - len(kept)]
            fetch *= 2


def _within_cap(
    hits: Sequence[ScoredChunk], per_document: int, top_k: int
) -> tuple[list[ScoredChunk], list[ScoredChunk]]:
    """(up to ``top_k`` hits within the per-document cap, in order; every other hit, in order)."""
    taken: Counter[tuple[str, str]] = Counter()  # per document of a collection
    kept: list[ScoredChunk] = []
    skipped: list[ScoredChunk] = []
    for hit in hits:
        document = (hit.collection, hit.doc_id)
        if taken[document] < per_document and len(kept) < top_k:
            taken[document] += 1
            kept.append(hit)
        else:
            skipped.append(hit)
    return kept, skipped
