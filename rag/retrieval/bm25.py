"""Lexical BM25 index (bm25s) over string-keyed texts, kept in step with adds and deletes.

bm25s builds an immutable sparse matrix, so this class keeps each text's tokens and rebuilds the
matrix lazily, on the first search after a change (milliseconds for thousands of chunks). Nothing is
persisted: the owner re-adds the stored chunk texts on load, which gives the identical index.

Tokens are lower-cased runs of word characters (two or more); an identifier with underscores also
yields its parts (``__getattr__`` -> ``__getattr__``, ``getattr``) and a light English suffix
stripper folds plurals and verb forms (``raises``/``raised`` -> ``rais``). Operators are tokens too
(runs of up to three operator characters: ``<<``, ``**``, ``^``), so a question about ``~`` can
match the text that explains it; longer runs are table rules and ASCII art, not operators.

Example:
    >>> bm25 = BM25Index()
    >>> bm25.add(["a", "b"], ["the cat sat on the mat", "dogs chase cats"])
    >>> [key for key, _ in bm25.search("cat", k=2)]
    ['b', 'a']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

_WORD = re.compile(r"\w\w+")
_OPERATOR = re.compile(r"[-+*/%@&|^~<>=!:]+")
_MAX_OPERATOR = 3
_SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ied", "ed", "es", "s")


def stem(word: str) -> str:
    """A deliberately light suffix stripper (no dependency): plural and verb endings only."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: -len(suffix)]
    return word


def tokenize(text: str, stemming: bool = True, operators: bool = True) -> list[str]:
    """Lexical tokens of ``text`` for BM25 (``operators``: operator runs are tokens too)."""
    tokens = []
    for word in _WORD.findall(text.lower()):
        tokens.append(stem(word) if stemming else word)
        if "_" in word.strip("_"):
            tokens.extend(part for part in word.split("_") if len(part) > 1)
        elif word.startswith("_") and len(word.strip("_")) > 1:
            tokens.append(word.strip("_"))
    if operators:
        tokens.extend(op for op in _OPERATOR.findall(text) if len(op) <= _MAX_OPERATOR)
    return tokens


class BM25Index:
    """BM25 over string keys, with add/delete; rebuilt lazily on the next search after a change.

    Example:
        >>> bm25 = BM25Index()
        >>> bm25.add(["x"], ["a frozen set is hashable"])
        >>> bm25.search("hashable frozenset", k=5)[0][0]
        'x'
        >>> bm25.delete(["x"]), bm25.search("hashable", k=5)
        (1, [])
    """

    def __init__(
        self, k1: float = 1.5, b: float = 0.75, stemming: bool = True, operators: bool = True
    ) -> None:
        self.k1, self.b, self.stemming, self.operators = k1, b, stemming, operators
        self._tokens: dict[str, list[str]] = {}
        self._order: list[str] = []  # key of each column of the built matrix
        self._column: dict[str, int] = {}
        self._bm25: Any = None
        self._dirty = False
        self._last: tuple[tuple[str, ...], np.ndarray] | None = None  # hybrid search scores a query twice

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, key: object) -> bool:
        return key in self._tokens

    def add(self, keys: Sequence[str], texts: Sequence[str]) -> None:
        """Index ``texts[i]`` under ``keys[i]`` (an existing key is replaced)."""
        if len(keys) != len(texts):
            raise ValueError(f"got {len(keys)} keys for {len(texts)} texts")
        for key, text in zip(keys, texts, strict=True):
            self._tokens[key] = tokenize(text, self.stemming, self.operators)
        self._dirty = self._dirty or bool(keys)

    def delete(self, keys: Iterable[str]) -> int:
        """Remove these keys (unknown ones are ignored); return how many were removed."""
        removed = sum(self._tokens.pop(key, None) is not None for key in keys)
        self._dirty = self._dirty or removed > 0
        return removed

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        """Up to ``k`` (key, BM25 score) pairs with a positive score, best first."""
        if k <= 0:
            raise ValueError(f"k must be > 0, got {k}")
        self._build()
        terms = self._terms(query)
        if not terms:
            return []
        scores = self._scores(terms)  # [n_docs]
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(self._order[i], float(scores[i])) for i in top.tolist() if scores[i] > 0]

    def score(self, query: str, keys: Sequence[str]) -> dict[str, float]:
        """BM25 score of each known key for ``query`` (0.0 when no query term occurs in it)."""
        self._build()
        known = [key for key in keys if key in self._tokens]
        terms = self._terms(query)
        if not terms or not known:
            return dict.fromkeys(known, 0.0)
        scores = self._scores(terms)  # [n_docs]
        column = self._column
        return {key: float(scores[column[key]]) for key in known}

    def _scores(self, terms: list[str]) -> np.ndarray:
        """Every document's score for these terms (the last query's are kept until the index changes)."""
        key = tuple(terms)
        if self._last is None or self._last[0] != key:
            self._last = (key, np.asarray(self._bm25.get_scores(terms), dtype=np.float32))
        return self._last[1]

    def _terms(self, query: str) -> list[str]:
        if self._bm25 is None:
            return []
        return [t for t in tokenize(query, self.stemming, self.operators) if t in self._bm25.vocab_dict]

    def _build(self) -> None:
        if not self._dirty:
            return
        import bm25s

        self._last = None
        self._order = list(self._tokens)
        self._column = {key: i for i, key in enumerate(self._order)}
        corpus = [self._tokens[key] or [""] for key in self._order]
        self._bm25 = None
        if corpus:
            self._bm25 = bm25s.BM25(k1=self.k1, b=self.b)
            self._bm25.index(corpus, show_progress=False)
        self._dirty = False
