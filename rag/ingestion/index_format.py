"""The files of a saved knowledge base: what one version directory (``rag.ingestion.persist``) holds.

    manifest.json    format number, the RAGConfig it was built with, counts (written last: its
                     presence marks a complete version)
    documents.json   every document with its digest and chunk ids, in insertion order
    chunks.json      every chunk
    <FAISS files>    the vector index (``VectorIndex.write``)

Plain JSON and FAISS's own format; nothing is pickled.

Example:
    >>> save_version(root, lambda d: write_index(d, config, records, chunks, index))  # doctest: +SKIP
    >>> saved = read_index(current_version(root))                                     # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.config import RAGConfig
from rag.ingestion.documents import Chunk, Document
from rag.retrieval.index import VectorIndex

FORMAT_VERSION = 1
# Fields fixed at ingest time: a saved index is only valid with the same values.
INGEST_FIELDS = (
    "embedder",
    "tokenizer_model",
    "chunk_size",
    "chunk_overlap",
    "title_in_embedding",
    "long_chunks",
)
# Ingest-time fields added after an index may have been written: the value such an index was built with.
_BUILT_BEFORE = {"long_chunks": "truncate"}


@dataclass
class DocumentRecord:
    """A stored document, the digest of its text and metadata, and its chunks' ids in text order."""

    doc: Document
    digest: str
    chunk_ids: list[str]


@dataclass
class SavedIndex:
    """Everything one version directory holds."""

    config: RAGConfig
    records: list[DocumentRecord]
    chunks: dict[str, Chunk]
    index: VectorIndex


def write_index(
    directory: Path,
    config: RAGConfig,
    records: Sequence[DocumentRecord],
    chunks: Mapping[str, Chunk],
    index: VectorIndex,
) -> None:
    """Write one complete version into ``directory`` (the caller makes it durable and publishes it)."""
    manifest = {
        "format": FORMAT_VERSION,
        "config": config.model_dump(mode="json", exclude={"index_dir"}),
        "embedder_dim": index.dim,
        "n_documents": len(records),
        "n_chunks": len(chunks),
    }
    docs = [
        {"doc": r.doc.model_dump(mode="json"), "digest": r.digest, "chunk_ids": r.chunk_ids} for r in records
    ]
    _write_json(directory / "documents.json", docs)
    _write_json(directory / "chunks.json", [c.model_dump(mode="json") for c in chunks.values()])
    index.write(directory)
    _write_json(directory / "manifest.json", manifest)  # last: its presence marks a complete write


def read_config(version: Path) -> RAGConfig:
    """The config a version was built with; ValueError for another format."""
    manifest = json.loads((version / "manifest.json").read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT_VERSION:
        raise ValueError(f"{version}: unsupported index format {manifest.get('format')!r}")
    return RAGConfig.model_validate({**_BUILT_BEFORE, **manifest["config"]})


def read_index(version: Path, config: RAGConfig) -> SavedIndex:
    """Read a version; ``config`` chooses the index kind. ValueError if a chunk has no vector."""
    docs = json.loads((version / "documents.json").read_text(encoding="utf-8"))
    chunks = json.loads((version / "chunks.json").read_text(encoding="utf-8"))
    by_id = {c["chunk_id"]: Chunk.model_validate(c) for c in chunks}
    records = [DocumentRecord(Document.model_validate(d["doc"]), d["digest"], d["chunk_ids"]) for d in docs]
    index = VectorIndex.read(version, kind=config.index_kind, hnsw_threshold=config.hnsw_threshold)
    missing = set(by_id) - set(index.keys())
    if missing:
        raise ValueError(f"{version}: {len(missing)} chunks have no vector (e.g. {sorted(missing)[0]!r})")
    return SavedIndex(config, records, by_id, index)


def check_compatible(config: RAGConfig, saved: RAGConfig, where: Path) -> RAGConfig:
    """``config`` with the saved index's ingest-time fields; ValueError naming a field that ``config``
    sets explicitly to another value (a field left at its default takes the saved value)."""
    for name in INGEST_FIELDS:
        if name in config.model_fields_set and getattr(config, name) != getattr(saved, name):
            raise ValueError(
                f"{where} was built with {name}={getattr(saved, name)!r}, but the config asks for "
                f"{getattr(config, name)!r}; re-ingest to change it"
            )
    return config.model_copy(update={name: getattr(saved, name) for name in INGEST_FIELDS})


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
