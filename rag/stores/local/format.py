"""The files of a local index directory: what one version directory (``rag.stores.local.versions``) holds.

    manifest.json    format number, the RAGConfig it was built with, the collections (name, folder,
                     counts); written last: its presence marks a complete version
    c0000/           one folder per collection (names never become paths):
      documents.json every document with its digest and chunk ids, in insertion order
      chunks.json    every chunk
      <FAISS files>  the vector index (``VectorIndex.write``)
      extra.json     (only with extra vector sets) chunk id -> row range of each set's ``extra-<n>.npy``:
                     the embedding reranker's window vectors (``rag.retrieval.windows``); optional,
                     an index without them loads as it is and gets them when first needed

A collection unchanged since the previous version is hard-linked from it rather than rewritten
(files are never modified in place, so versions can share them). Format 1 (before collections) held
one collection's files at the top level; it loads as the collection ``"default"``.
Plain JSON and FAISS's own format; nothing is pickled.

Example:
    >>> save_version(root, lambda d: write_index(d, config, collections))  # doctest: +SKIP
    >>> parts = read_index(current_version(root), config)                  # doctest: +SKIP
    >>> sorted(parts)                                                      # doctest: +SKIP
    ['alice', 'default']
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.retrieval.index import VectorIndex
from rag.stores.collection import Collection, CollectionParts, DocumentRecord
from rag.stores.compat import NOT_SAVED, saved_config
from rag.types import DEFAULT_COLLECTION, Chunk, Document, check_collection

FORMAT_VERSION = 2
_LEGACY_FORMAT = 1  # one collection, its files at the top of the version directory


def write_index(
    directory: Path,
    config: RAGConfig,
    collections: Sequence[Collection],
    unchanged: Mapping[str, Path] | None = None,
) -> dict[str, str]:
    """Write one complete version into ``directory`` (the caller makes it durable and publishes it);
    return each collection's folder name.

    Empty collections are left out. ``unchanged`` maps a collection name to the folder of a previous
    version that already holds exactly its files: they are hard-linked instead of written again.
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
            _write_collection(directory / folder, collection)
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
        "config": config.model_dump(mode="json", exclude=NOT_SAVED),
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
    return saved_config(manifest["config"])


def read_index(version: Path, config: RAGConfig) -> dict[str, CollectionParts]:
    """Read a version: each collection's parts, by name; ``config`` chooses the index kind.
    ValueError if a chunk has no vector."""
    manifest = _manifest(version)
    if manifest.get("format") == _LEGACY_FORMAT:
        folders = [(DEFAULT_COLLECTION, version)]
    else:
        folders = [
            (check_collection(e["name"]), version / _plain_name(e["dir"])) for e in manifest["collections"]
        ]
    return {name: _read_collection(folder, name, config) for name, folder in folders}


def _write_collection(folder: Path, collection: Collection) -> None:
    docs = [
        {"doc": r.doc.model_dump(mode="json"), "digest": r.digest, "chunk_ids": r.chunk_ids}
        for r in collection.docs.values()
    ]
    _write_json(folder / "documents.json", docs)
    _write_json(folder / "chunks.json", [c.model_dump(mode="json") for c in collection.chunks.values()])
    collection.index.write(folder)
    if collection.extra:
        _write_extra(folder, collection.extra)


def _write_extra(folder: Path, extra: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    """Each named vector set as one ``extra-<n>.npy`` of stacked rows, and where each chunk's are."""
    sets = []
    for n, (name, by_id) in enumerate(sorted(extra.items())):
        spans: dict[str, list[int]] = {}
        rows = []
        start = 0
        for chunk_id, vectors in by_id.items():
            spans[chunk_id] = [start, start + len(vectors)]
            rows.append(np.asarray(vectors, dtype=np.float32))
            start += len(vectors)
        dim = rows[0].shape[1] if rows else 0
        stacked = np.concatenate(rows) if rows else np.zeros((0, dim), dtype=np.float32)
        np.save(folder / f"extra-{n}.npy", stacked, allow_pickle=False)
        sets.append({"name": name, "file": f"extra-{n}.npy", "rows": spans})
    _write_json(folder / "extra.json", sets)


def _read_extra(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    path = folder / "extra.json"
    if not path.is_file():
        return {}
    extra: dict[str, dict[str, np.ndarray]] = {}
    for entry in json.loads(path.read_text(encoding="utf-8")):
        rows = np.load(folder / _plain_name(entry["file"]), allow_pickle=False)
        extra[str(entry["name"])] = {key: rows[a:b] for key, (a, b) in entry["rows"].items()}
    return extra


def _read_collection(folder: Path, name: str, config: RAGConfig) -> CollectionParts:
    docs = json.loads((folder / "documents.json").read_text(encoding="utf-8"))
    chunks = json.loads((folder / "chunks.json").read_text(encoding="utf-8"))
    # format 1 chunks carry no collection: they are the default collection's
    by_id = {c["chunk_id"]: Chunk.model_validate({**c, "collection": name}) for c in chunks}
    records = [DocumentRecord(Document.model_validate(d["doc"]), d["digest"], d["chunk_ids"]) for d in docs]
    index = VectorIndex.read(folder, kind=config.index_kind, hnsw_threshold=config.hnsw_threshold)
    missing = set(by_id) - set(index.keys())
    if missing:
        raise ValueError(f"{folder}: {len(missing)} chunks have no vector (e.g. {sorted(missing)[0]!r})")
    return CollectionParts(records, by_id, index, _read_extra(folder))


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
