"""Query: a question checked once, where it enters, and handed inward as proof of it.

Public entry points (``Pipeline.ask/stream/retrieve``, ``KnowledgeBase.search*``, a retriever's
``retrieve``) build a ``Query`` with ``Query.of``, the one place the text, ``top_k`` and collection
names are checked; inner layers (``KnowledgeBase.run``, a retriever's ``search``) take the Query
and check nothing again. ``deeper`` asks the same question for more hits (fusion pools, diversity
fetches, reranker candidates).

Example:
    >>> q = Query.of("What does pass do?", None, ["alice", "shared", "alice"], default_top_k=4)
    >>> q.text, q.top_k, q.collections
    ('What does pass do?', 4, ('alice', 'shared'))
    >>> q.deeper(50).top_k
    50
    >>> Query.of("  ", 4)
    Traceback (most recent call last):
    ...
    ValueError: query must be a non-empty string, got '  '
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from rag.types import check_collection


def check_top_k(top_k: object) -> int:
    """``top_k`` itself, or ValueError naming it when it is not a positive int (the one owner of this rule)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    return top_k


def collection_names(collections: Iterable[str]) -> tuple[str, ...]:
    """Validated collection names, each once, in order (a bare string is refused: it would be read
    letter by letter)."""
    if isinstance(collections, str):
        raise ValueError(f"collections must be a list of names, got the string {collections!r}")
    return tuple(dict.fromkeys(check_collection(name) for name in collections))


@dataclass(frozen=True)
class Query:
    """A checked question: non-blank ``text``, a positive ``top_k``, validated ``collections``
    (None: every collection). Build it with ``of``; the constructor itself checks nothing.

    Example:
        >>> Query.of("Who?", 2).collections is None
        True
    """

    text: str
    top_k: int
    collections: tuple[str, ...] | None = None

    @classmethod
    def of(
        cls,
        text: object,
        top_k: object,
        collections: Iterable[str] | None = None,
        *,
        default_top_k: int | None = None,
        name: str = "query",
    ) -> Query:
        """The checked query; ValueError naming the bad value (``name``: what the caller calls the
        text). ``top_k`` None takes ``default_top_k`` (a config's, checked there)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{name} must be a non-empty string, got {text!r}")
        k = default_top_k if top_k is None and default_top_k is not None else check_top_k(top_k)
        names = None if collections is None else collection_names(collections)
        return cls(text, k, names)

    def deeper(self, top_k: int) -> Query:
        """The same question asking for ``top_k`` hits (a positive count an inner layer computed)."""
        assert top_k > 0, top_k
        return replace(self, top_k=top_k)
