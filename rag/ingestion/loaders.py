"""Load files and folders into Documents; skip what cannot be read, and say why.

Supported: ``.txt``/``.md`` (and any other UTF-8 text), ``.html``/``.htm`` (text only, scripts and
styles dropped) and ``.pdf`` (pypdf). A document's id is its path relative to the folder it was found
in (a file given directly: its name), with ``/`` separators, so re-ingesting the same tree gives the
same ids.

Example:
    >>> result = load_paths(["docs/", "notes.md"])            # doctest: +SKIP
    >>> [d.id for d in result.documents], [(s.path, s.reason) for s in result.skipped]  # doctest: +SKIP
    (['guide/intro.md', 'notes.md'], [('docs/logo.png', 'binary file')])
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from rag.types import Document

HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class SkippedFile:
    """A file that was not loaded, and the reason."""

    path: str
    reason: str


@dataclass
class LoadResult:
    """Documents loaded, in path order, and the files skipped with their reasons."""

    documents: list[Document] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)


class _Skip(Exception):
    """Raised by a reader for a file that cannot become a document."""


def load_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> LoadResult:
    """Load files and folders (recursively). A missing path raises FileNotFoundError naming it.

    Hidden files and folders (name starting with ``.``) are reported as skipped, not descended into.
    Two files that would get the same id raise ValueError naming both.
    """
    roots = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    for root in roots:
        if not Path(root).exists():
            raise FileNotFoundError(f"no such file or directory: {os.fspath(root)!r}")
    result = LoadResult()
    seen: dict[str, str] = {}
    for root in roots:
        for path, doc_id in _walk(Path(root), result.skipped):
            try:
                text, extra = read_file(path)
            except _Skip as why:
                result.skipped.append(SkippedFile(str(path), str(why)))
                continue
            if doc_id in seen:
                raise ValueError(f"document id {doc_id!r} is produced by both {seen[doc_id]} and {path}")
            seen[doc_id] = str(path)
            result.documents.append(Document(id=doc_id, text=text, metadata={**_metadata(path), **extra}))
    return result


def load_python_reference() -> list[Document]:
    """The bundled corpus: CPython's language reference topics (``pydoc_data.topics``).

    One Document per topic; its id is the topic name and its metadata ``{"topic": name}``.
    """
    from pydoc_data.topics import topics

    return [Document(id=name, text=text, metadata={"topic": name}) for name, text in sorted(topics.items())]


def _walk(root: Path, skipped: list[SkippedFile]) -> Iterator[tuple[Path, str]]:
    """(file, id) pairs under root in sorted order; hidden entries and broken links go to skipped."""
    if not root.is_dir():
        yield root, root.name
        return
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if name.startswith("."):
                skipped.append(SkippedFile(str(here / name), "hidden directory"))
            elif (here / name).is_symlink():
                skipped.append(SkippedFile(str(here / name), "symbolic link to a directory (not followed)"))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not (here / d).is_symlink())
        for name in sorted(filenames):
            path = here / name
            if name.startswith("."):
                skipped.append(SkippedFile(str(path), "hidden file"))
            elif not path.exists():
                skipped.append(SkippedFile(str(path), "unreadable: broken symbolic link"))
            else:
                yield path, path.relative_to(root).as_posix()


def _metadata(path: Path) -> dict[str, object]:
    return {"source": str(path.resolve()), "format": _format(path)}


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return "pdf"
    if suffix in HTML_SUFFIXES:
        return "html"
    return "markdown" if suffix in {".md", ".markdown"} else "text"


def read_file(path: Path) -> tuple[str, dict[str, object]]:
    """(text, extra metadata) of one file by format; raises _Skip with a reason for anything unusable."""
    extra: dict[str, object] = {}
    if not path.is_file():
        raise _Skip("not a regular file")
    try:
        fmt = _format(path)
        text = _read_pdf(path, extra) if fmt == "pdf" else _decode(path.read_bytes())
        if fmt == "html":
            text, title = html_to_text(text)
            if title:
                extra["title"] = title
    except OSError as err:
        raise _Skip(f"unreadable: {err.strerror or err}") from err
    if not text.strip():
        raise _Skip("empty: no text content")
    return text, extra


def _decode(data: bytes) -> str:
    """UTF-8 (a BOM, also UTF-16's, is honoured); NUL bytes mean binary; anything else is skipped."""
    for bom, codec in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if data.startswith(bom):
            try:
                return data.decode(codec)
            except UnicodeDecodeError as err:
                raise _Skip(f"not valid {codec} text: {err.reason} at byte {err.start}") from err
    if b"\x00" in data[:_SNIFF_BYTES]:
        raise _Skip("binary file (contains NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _Skip(f"not UTF-8 text: invalid byte 0x{data[err.start]:02x} at offset {err.start}") from err


def _read_pdf(path: Path, extra: dict[str, object]) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise _Skip("encrypted PDF (needs a password)")
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError) as err:
        raise _Skip(f"unreadable PDF: {err}") from err
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    extra["pages"] = len(pages)
    if not text:
        raise _Skip("empty: PDF has no extractable text (scanned images?)")
    return text


_BLOCK_TAGS = frozenset(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "br",
        "dd",
        "div",
        "dl",
        "dt",
        "figcaption",
        "figure",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "pre",
        "section",
        "table",
        "td",
        "th",
        "tr",
        "ul",
    ]
)
_DROP_TAGS = frozenset({"script", "style", "noscript", "template", "head", "svg"})


class _TextExtractor(HTMLParser):
    """Collects visible text; block-level tags become paragraph breaks."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self._dropping = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_title = self._in_title or tag == "title"
        if tag in _DROP_TAGS:
            self._dropping += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        self._in_title = self._in_title and tag != "title"
        if tag in _DROP_TAGS:
            self._dropping = max(0, self._dropping - 1)
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._dropping:
            self.parts.append(data)


def html_to_text(html: str) -> tuple[str, str]:
    """(visible text, title) of an HTML page: tags, scripts and styles removed, paragraphs kept."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = [re.sub(r"[ \t\r\f\v]+", " ", line).strip() for line in "".join(parser.parts).split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return text, " ".join("".join(parser.title).split())
