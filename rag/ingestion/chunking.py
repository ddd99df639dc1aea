"""Token-aware splitting of documents into overlapping chunks, and the title their chunks carry.

Token counts come from the LLM's tokenizer (what the prompt budget is made of). Text is cut at the
coarsest boundary that fits: paragraph, then sentence, then line, then word, then (for a single
over-long "word") characters. Pieces are packed greedily into chunks of at most ``chunk_size`` tokens;
each chunk after the first starts with up to ``overlap`` tokens from the end of the previous one,
beginning at a sentence start when one is close enough, else at a word start.

Example:
    >>> chunker = Chunker(chunk_size=64, overlap=8)                 # doctest: +SKIP
    >>> [c.n_tokens <= 64 for c in chunker.split(Document(id="a", text=long_text))]  # doctest: +SKIP
    [True, True, True]
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from rag.types import DEFAULT_COLLECTION, Chunk, Document

CHUNK_TOKENS = 256  # max LLM tokens per chunk
CHUNK_OVERLAP = 32  # tokens a chunk repeats from the previous one

Span = tuple[int, int]

# Boundaries, coarse to fine; each regex matches the separator *between* two pieces.
_LEVELS = (
    re.compile(r"\n[ \t]*\n\s*"),  # paragraph: a blank line
    re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=\S)"),  # sentence: terminal punctuation then space
    re.compile(r"\n\s*"),  # line
    re.compile(r"\s+"),  # word
)
_SENTENCE_START = re.compile(r"(?:\n[ \t]*\n|(?<=[.!?])[\"')\]]*\s+)(?=\S)")


def token_counter(tokenizer: Any) -> Callable[[str], int]:
    """A ``str -> int`` token counter from a HF tokenizer, anything with ``encode``, or a callable.

    A callable may return a count or a sequence of token ids.
    """
    encode = getattr(tokenizer, "encode", None)
    if encode is not None:
        try:
            encode("probe", add_special_tokens=False)
            return lambda text: len(encode(text, add_special_tokens=False))
        except TypeError:
            return lambda text: len(encode(text))
    if callable(tokenizer):
        fn = tokenizer
        return lambda text: n if isinstance(n := fn(text), int) else len(n)
    raise ValueError(f"tokenizer must have an encode method or be callable, got {type(tokenizer).__name__}")


def chunk_id(doc_id: str, text: str, occurrence: int = 0, collection: str = DEFAULT_COLLECTION) -> str:
    """Content address of a chunk: sha256 of doc id and text (plus the repeat index of duplicates),
    and of the collection unless it is the default one (whose ids predate collections)."""
    if collection != DEFAULT_COLLECTION:  # JSON never holds a raw NUL, the key below always does
        key = json.dumps([collection, doc_id, text, occurrence])
    else:
        key = f"{doc_id}\x00{text}" + (f"\x00{occurrence}" if occurrence else "")
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def document_title(doc: Document) -> str | None:
    """A document's title: ``metadata["title"]``, a leading markdown heading, or a short first line
    that is underlined or followed by a blank line; None when there is no such line."""
    title = doc.metadata.get("title")
    if isinstance(title, str) and title.strip():
        return " ".join(title.split())
    lines = doc.text.lstrip().splitlines()
    if not lines:
        return None
    first = lines[0].strip()
    if first.startswith("#"):
        first = first.lstrip("#").strip()
    elif len(lines) > 1 and lines[1].strip() and not re.fullmatch(r"[=\-*~^#]{3,}", lines[1].strip()):
        return None
    return first if 0 < len(first) <= 120 else None


class Chunker:
    """Splits Documents into Chunks of at most ``chunk_size`` tokens with ``overlap`` tokens of overlap.

    ``tokenizer`` is a HF tokenizer, an object with ``encode``, or a callable; a string names a model
    (engine registry name or HF dir) whose tokenizer ``engine.models.load_tokenizer`` loads on first
    use; None means the default LLM's.

    Example:
        >>> chunker = Chunker(chunk_size=256, overlap=32)         # doctest: +SKIP
        >>> chunks = chunker.split(Document(id="a", text="First paragraph.\\n\\nSecond one."))  # doctest: +SKIP
        >>> [(c.start, c.end, c.n_tokens) for c in chunks]        # doctest: +SKIP
        [(0, 29, 7)]
    """

    def __init__(
        self, tokenizer: Any = None, chunk_size: int = CHUNK_TOKENS, overlap: int = CHUNK_OVERLAP
    ) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
        if not 0 <= overlap < chunk_size:
            raise ValueError(f"overlap must be in [0, chunk_size={chunk_size}), got {overlap}")
        self.chunk_size = chunk_size
        self.overlap = overlap
        self._tokenizer = tokenizer
        self._count: Callable[[str], int] | None = None
        self._parent: Chunker | None = None

    def warm_up(self) -> None:
        """Load the tokenizer (idempotent)."""
        if self._count is not None:
            return
        if self._parent is not None:
            self._parent.warm_up()
            self._tokenizer = self._parent._tokenizer
        if self._tokenizer is None or isinstance(self._tokenizer, str):
            from engine.models import DEFAULT_MODEL, load_tokenizer

            self._tokenizer = load_tokenizer(self._tokenizer or DEFAULT_MODEL)
        self._count = token_counter(self._tokenizer)

    def resized(self, chunk_size: int, overlap: int) -> Chunker:
        """A chunker with other sizes that shares this one's tokenizer (loaded once, lazily)."""
        other = Chunker(None, chunk_size, overlap)
        other._parent = self
        return other

    def count_tokens(self, text: str) -> int:
        """Number of LLM tokens in ``text`` (no special tokens)."""
        self.warm_up()
        assert self._count is not None
        return self._count(text)

    def split(self, doc: Document, collection: str = DEFAULT_COLLECTION) -> list[Chunk]:
        """The chunks of ``doc`` (stored in ``collection``) in text order; a blank document has none."""
        text = doc.text
        spans = self.spans(text)
        seen: dict[str, int] = {}
        chunks = []
        for start, end in spans:
            piece = text[start:end]
            occurrence = seen.get(piece, 0)
            seen[piece] = occurrence + 1
            chunks.append(
                Chunk(
                    doc_id=doc.id,
                    chunk_id=chunk_id(doc.id, piece, occurrence, collection),
                    text=piece,
                    start=start,
                    end=end,
                    n_tokens=self.count_tokens(piece),
                    metadata=dict(doc.metadata),
                    collection=collection,
                )
            )
        return chunks

    def spans(self, text: str) -> list[Span]:
        """Character spans ``(start, end)`` of the chunks of ``text``."""
        units = self._pieces(text, _strip(text, 0, len(text)), level=0)
        chunks: list[Span] = []
        i, prefix = 0, None
        while i < len(units):
            start = units[i][0]
            if prefix is not None and self._fits(text, prefix, units[i][1]):
                start = prefix
            j = i
            while j + 1 < len(units) and self._fits(text, start, units[j + 1][1]):
                j += 1
            chunks.append((start, units[j][1]))
            i = j + 1
            prefix = (
                self._overlap_start(text, start, units[j][1]) if self.overlap and i < len(units) else None
            )
        return chunks

    def _fits(self, text: str, start: int, end: int) -> bool:
        return self.count_tokens(text[start:end]) <= self.chunk_size

    def _pieces(self, text: str, span: Span | None, level: int) -> list[Span]:
        """Split span at the coarsest boundaries needed so every piece fits in chunk_size tokens."""
        if span is None:
            return []
        if level > 0 and self._fits(text, *span):
            return [span]
        if level == len(_LEVELS):
            return self._hard_split(text, span)
        start, end = span
        pieces: list[Span] = []
        cut = start
        for m in _LEVELS[level].finditer(text, start, end):
            pieces += self._pieces(text, _strip(text, cut, m.start()), level + 1)
            cut = m.end()
        return pieces + self._pieces(text, _strip(text, cut, end), level + 1)

    def _hard_split(self, text: str, span: Span) -> list[Span]:
        """Cut an unbreakable run of characters into the longest prefixes that fit."""
        start, end = span
        pieces = []
        while start < end:
            lo, hi = start + 1, end  # largest cut in [lo, hi] that fits; one character always does
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if self._fits(text, start, mid) else (lo, mid - 1)
            pieces.append((start, lo))
            start = lo
        return pieces

    def _overlap_start(self, text: str, start: int, end: int) -> int | None:
        """Where the next chunk should begin so it repeats at most ``overlap`` tokens of this one."""
        words = [m.start() for m in re.finditer(r"\S+", text[start:end])]
        words = [start + w for w in words[1:]]  # never repeat the whole chunk
        lo, hi = 0, len(words)  # first word index whose tail fits in the overlap budget
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.count_tokens(text[words[mid] : end]) <= self.overlap else (mid + 1, hi)
        if lo == len(words):
            return None
        first = words[lo]
        sentences = [m.end() for m in _SENTENCE_START.finditer(text, first, end)]
        k = bisect.bisect_left(sentences, first)
        if k < len(sentences) and 2 * self.count_tokens(text[sentences[k] : end]) >= self.overlap:
            return sentences[k]
        return first


def _strip(text: str, start: int, end: int) -> Span | None:
    """The span without surrounding whitespace, or None when nothing is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None
