"""Turning request bodies into Documents (JSON items, uploaded files) and documents into responses.

Uploaded file names are never used as paths: each file is written under a fresh temporary directory
with a sanitised name (so its extension picks the reader), read, and the directory removed.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import unicodedata
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from rag.api.schemas.rag import DocumentIn, DocumentOut
from rag.types import DEFAULT_COLLECTION

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME = 128


class UploadError(ValueError):
    """An uploaded file that cannot become a document (status 415 or 422)."""

    def __init__(self, message: str, status: int = 422, code: str = "unreadable_file") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def safe_filename(name: str | None) -> str:
    """A plain file name from a client-supplied one: no directories, no control or odd characters.

    Example:
        >>> safe_filename("../../etc/passwd"), safe_filename("C:\\\\tmp\\\\my r\u00e9sum\u00e9.md"), safe_filename(".env")
        ('passwd', 'my_resume.md', 'env')
    """
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = unicodedata.normalize("NFKD", base).encode("ascii", "ignore").decode("ascii")
    base = _UNSAFE.sub("_", base).strip("._")
    if len(base) > _MAX_NAME:
        stem, dot, ext = base.rpartition(".")
        base = (stem[: _MAX_NAME - len(ext) - 1] + dot + ext) if dot and len(ext) <= 10 else base[:_MAX_NAME]
    return base or "upload.txt"


def derived_id(text: str) -> str:
    """A stable id for a document sent without one: ``doc-`` + 16 hex digits of its text's SHA-256."""
    return "doc-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def documents_from_json(items: list[DocumentIn]) -> list[Any]:
    from rag.types import Document

    docs = []
    for i, item in enumerate(items):
        if "\x00" in item.text:
            raise ValueError(f"documents[{i}].text contains a NUL character")
        if not item.text.strip():
            raise ValueError(f"documents[{i}].text is empty (only whitespace)")
        doc_id = item.id if item.id is not None else derived_id(item.text)
        if not doc_id.strip() or any(unicodedata.category(c) == "Cc" for c in doc_id):
            raise ValueError(f"documents[{i}].id must be non-blank and free of control characters")
        docs.append(Document(id=doc_id, text=item.text, metadata=item.metadata))
    return docs


def documents_from_upload(files: list[Any]) -> list[Any]:
    """Documents from Starlette ``UploadFile``s (read synchronously: call from a worker thread)."""
    from rag.types import Document

    docs = []
    seen: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="prefixrag-upload-") as tmp:
        for upload in files:
            name = safe_filename(upload.filename)
            if name in seen:
                raise UploadError(f"two uploaded files are both named {name!r}", code="duplicate_name")
            seen.add(name)
            path = Path(tmp) / name
            upload.file.seek(0)
            path.write_bytes(upload.file.read())
            text, extra = _read(path, name)
            if not text.strip():
                raise UploadError(f"{name!r} contains no text", code="empty_file")
            docs.append(Document(id=name, text=text, metadata={**extra, "source": name, "filename": name}))
    return docs


def _read(path: Path, name: str) -> tuple[str, dict[str, Any]]:
    """The text of a file by its extension (``rag.ingestion.loaders.read_file``: text, Markdown, HTML, PDF)."""
    from rag.ingestion.loaders import read_file

    try:
        text, extra = read_file(path)
    except Exception as exc:  # the loader's "cannot read" (binary, broken PDF, bad encoding, ...)
        raise UploadError(f"cannot read {name!r}: {exc}", status=415, code="unsupported_file") from exc
    if "\x00" in text:
        raise UploadError(
            f"cannot read {name!r}: it contains NUL characters", status=415, code="unsupported_file"
        )
    return text, {k: v for k, v in extra.items() if k != "source"}


def info_out(item: Any, collection: str | None = None) -> DocumentOut:
    """A DocumentInfo / Document / dict from the pipeline as the API's DocumentOut (``collection``: where
    it is stored, when the item does not say)."""
    if isinstance(item, str):
        return DocumentOut(id=item, collection=collection or DEFAULT_COLLECTION)
    data = asdict(item) if is_dataclass(item) and not isinstance(item, type) else _dump(item)
    return DocumentOut(
        id=str(data["id"]),
        collection=str(data.get("collection") or collection or DEFAULT_COLLECTION),
        metadata=dict(data.get("metadata") or {}),
        text=data.get("text"),
        chunks=data.get("n_chunks", data.get("chunks")),
        chars=data.get("n_chars", len(data["text"]) if isinstance(data.get("text"), str) else None),
    )


def _dump(item: Any) -> dict[str, Any]:
    if hasattr(item, "model_dump"):
        dumped: dict[str, Any] = item.model_dump()
        return dumped
    return dict(item) if isinstance(item, dict) else dict(vars(item))
