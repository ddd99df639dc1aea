"""The files of a saved knowledge base: what one version directory (``rag.ingestion.persist``) holds.

    manifest.json    format number, the RAGConfig it was built with, the collections (name, folder,
                     counts); written last: its presence marks a complete version
    c0000/           one folder per collection (names never become paths):
      documents.json every document with its digest and chunk ids, in insertion order
      chunks.json    every chunk
      <FAISS files>  the vector index (``VectorIndex.write``)
      windows.npy    optional: the chunks' window vectors for the embedding reranker, stacked
      windows.json   their settings and each chunk's rows (an index without them loads as it is;
                     they are computed when first needed)

A collection unchanged since the previous version is hard-linked from it rather than rewritten
(files are never modified in place, so versions can share them). Format 1 (before collections) held
one collection's files at the top level; it loads as the collection ``"default"``.
Plain JSON and FAISS's own format; nothing is pickled.

Example:
    >>> save_version(root, lambda d: write_index(d, config, collections))  # doctest: +SKIP
    >>> saved = read_index(current_version(root), config)                  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.ingestion.collection import Collection, DocumentRecord
from rag.retrieval.index import VectorIndex
from rag.types import DEFAULT_COLLECTION, Chunk, Document, check_collection

FORMAT_VERSION = 2
_LEGACY_FORMAT = 1  # one collection, its files at the top of the version directory
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

# Not properties of an index: where it lives, and the engine that answers from it (indexes saved
# before this rule carry an "engine" entry, which loading ignores).
_NOT_SAVED = {"index_dir", "engine"}


WINDOWS_NPY, WINDOWS_JSON = "windows.npy", "windows.json"


@dataclass
class SavedCollection:
    """One collection as read from disk (``windows``: the window vectors saved with it, and the
    settings they were computed with; empty for an index saved without them)."""

    name: str
    records: list[DocumentRecord]
    chunks: dict[str, Chunk]
    index: VectorIndex
    windows: dict[str, np.ndarray] = field(default_factory=dict)
    window_settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class SavedIndex:
    """Everything one version directory holds."""

    config: RAGConfig
    collections: list[SavedCollection]


def write_index(
    directory: Path,
    config: RAGConfig,
    collections: Sequence[Collection],
    unchanged: Mapping[str, Path] | None = None,
    window_settings: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Write one complete version into ``directory`` (the caller makes it durable and publishes it);
    return each collection's folder name.

    Empty collections are left out. ``unchanged`` maps a collection name to the folder of a previous
    version that already holds exactly its files: they are hard-linked instead of written again.
    ``window_settings``: what the collections' window vectors were computed with (saved beside them).
    """
    unchanged = unchanged or {}
    entries: list[dict[str, Any]] = []
    for collection in (c for c in collections if len(c)):
        folder = f"c{len(entries):04d}"
        (directory / folder).mkdir()
        source = unchanged.get(collection.name)
        if source is not None:
            _link_files(source, directory / folder)
        else:
            _write_collection(directory / folder, collection, window_settings or {})
        entries.append(
            {
                "name": collection.name,
                "dir": folder,
                "n_documents": len(collection),
                "n_chunks": collection.n_chunks,
                "embedder_dim": collection.index.dim,
            }
        )
    manifest = {
        "format": FORMAT_VERSION,
        "config": config.model_dump(mode="json", exclude=_NOT_SAVED),
        "collections": entries,
        "n_documents": sum(e["n_documents"] for e in entries),
        "n_chunks": sum(e["n_chunks"] for e in entries),
    }
    _write_json(directory / "manifest.json", manifest)  # last: its presence marks a complete write
    return {e["name"]: e["dir"] for e in entries}


def collection_folders(version: Path) -> dict[str, Path]:
    """Collection name -> its folder in a saved version (format 2; empty for older formats)."""
    manifest = _manifest(version)
    if manifest.get("format") != FORMAT_VERSION:
        return {}
    return {e["name"]: version / e["dir"] for e in manifest["collections"]}


def read_config(version: Path) -> RAGConfig:
    """The config a version was built with; ValueError for an unknown format."""
    manifest = _manifest(version)
    if manifest.get("format") not in (FORMAT_VERSION, _LEGACY_FORMAT):
        raise ValueError(f"{version}: unsupported index format {manifest.get('format')!r}")
    saved = {k: v for k, v in manifest["config"].items() if k not in _NOT_SAVED}
    return RAGConfig.model_validate({**_BUILT_BEFORE, **saved})


def read_index(version: Path, config: RAGConfig) -> SavedIndex:
    """Read a version; ``config`` chooses the index kind. ValueError if a chunk has no vector."""
    manifest = _manifest(version)
    if manifest.get("format") == _LEGACY_FORMAT:
        folders = [(DEFAULT_COLLECTION, version)]
    else:
        folders = [
            (check_collection(e["name"]), version / _plain_name(e["dir"])) for e in manifest["collections"]
        ]
    return SavedIndex(config, [_read_collection(name, folder, config) for name, folder in folders])


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


def _write_collection(folder: Path, collection: Collection, window_settings: Mapping[str, Any]) -> None:
    docs = [
        {"doc": r.doc.model_dump(mode="json"), "digest": r.digest, "chunk_ids": r.chunk_ids}
        for r in collection.docs.values()
    ]
    _write_json(folder / "documents.json", docs)
    _write_json(folder / "chunks.json", [c.model_dump(mode="json") for c in collection.chunks.values()])
    collection.index.write(folder)
    if collection.windows:
        _write_windows(folder, collection.windows, window_settings)


def _write_windows(folder: Path, windows: Mapping[str, np.ndarray], settings: Mapping[str, Any]) -> None:
    rows: dict[str, list[int]] = {}
    start = 0
    for chunk_id, vectors in windows.items():
        rows[chunk_id] = [start, len(vectors)]
        start += len(vectors)
    with open(folder / WINDOWS_NPY, "wb") as f:
        np.save(f, np.concatenate(list(windows.values())).astype(np.float32), allow_pickle=False)
    _write_json(folder / WINDOWS_JSON, {"settings": dict(settings), "rows": rows})


def _read_windows(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The window vectors saved in a collection folder and their settings (empty when there are none)."""
    if not (folder / WINDOWS_JSON).is_file():
        return {}, {}
    meta = json.loads((folder / WINDOWS_JSON).read_text(encoding="utf-8"))
    stacked = np.load(folder / WINDOWS_NPY, allow_pickle=False)  # [windows, dim]
    windows = {chunk_id: stacked[a : a + n] for chunk_id, (a, n) in meta["rows"].items()}
    return windows, dict(meta["settings"])


def _read_collection(name: str, folder: Path, config: RAGConfig) -> SavedCollection:
    docs = json.loads((folder / "documents.json").read_text(encoding="utf-8"))
    chunks = json.loads((folder / "chunks.json").read_text(encoding="utf-8"))
    # format 1 chunks carry no collection: they are the default collection's
    by_id = {c["chunk_id"]: Chunk.model_validate({**c, "collection": name}) for c in chunks}
    records = [DocumentRecord(Document.model_validate(d["doc"]), d["digest"], d["chunk_ids"]) for d in docs]
    index = VectorIndex.read(folder, kind=config.index_kind, hnsw_threshold=config.hnsw_threshold)
    missing = set(by_id) - set(index.keys())
    if missing:
        raise ValueError(f"{folder}: {len(missing)} chunks have no vector (e.g. {sorted(missing)[0]!r})")
    windows, settings = _read_windows(folder)
    return SavedCollection(name, records, by_id, index, windows, settings)


def _link_files(source: Path, target: Path) -> None:
    for path in source.iterdir():
        if path.is_file():
            os.link(path, target / path.name)


def _plain_name(name: str) -> str:
    """A manifest's folder name, refused unless it is a plain name inside the version."""
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"manifest names the collection folder {name!r}, which is not a plain name")
    return name


def _manifest(version: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((version / "manifest.json").read_text(encoding="utf-8"))
    return manifest


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
