"""Documents to rows and back: the SQL of one write, one delete, the changes after a position and a
whole-store load. Vectors travel as float32 little-endian bytes (bytea), JSON as jsonb; nothing is
pickled.

Every function runs inside a transaction the caller opened; writes take the log lock first, so
their positions are drawn in commit order (``rag.stores.postgres.schema``).

Example:
    >>> with conn.transaction():                       # doctest: +SKIP
    ...     positions = write_documents(conn, writes)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from rag.retrieval.index import VectorIndex
from rag.stores.collection import CollectionParts, DocumentRecord
from rag.stores.postgres.schema import CHANNEL, WRITE_LOCK
from rag.stores.protocol import Change, ChangeBatch, ChunkRecord, DocumentWrite
from rag.types import Chunk, Document, DocumentInfo

Key = tuple[str, str]
_BATCH = 2000  # changes read per step of catching up
_ITERSIZE = 2000  # rows per round trip when streaming a whole store


def encode(vectors: np.ndarray) -> tuple[int, bytes]:
    """(dim, float32 little-endian bytes) of a ``[n, dim]`` array."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    if rows.ndim != 2 or not rows.shape[0] or not rows.shape[1]:
        raise ValueError(f"vectors must have shape [n, dim] with n, dim >= 1, got {list(rows.shape)}")
    return int(rows.shape[1]), rows.tobytes()


def decode(dim: int, data: bytes) -> np.ndarray:
    """The ``[n, dim]`` float32 array ``encode`` wrote."""
    return np.frombuffer(data, dtype="<f4").reshape(-1, dim).astype(np.float32)


# ---- writes ---------------------------------------------------------------------------------------


def write_documents(conn: psycopg.Connection, writes: Sequence[DocumentWrite]) -> list[int]:
    """Store whole documents (replacing their chunks) and log them; each write's position, in order.
    A document stored with the same digest already is left as it is (nothing logged): its position
    is the one it was stored at."""
    encoded = {w.key: [encode(r.vectors) for r in w.chunks] for w in writes}  # bad vectors fail first
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
    stored = _stored_digests(conn, [w.key for w in writes])
    with conn.cursor() as cur:
        positions: list[int] = []
        changed: list[tuple[DocumentWrite, int]] = []
        for w in writes:
            same = stored.get(w.key)
            if same is not None and same[0] == w.digest:
                positions.append(same[1])
                continue
            positions.append(_log(cur, w.collection, w.document.id, "put"))
            changed.append((w, positions[-1]))
        if not changed:
            return positions
        for w, position in changed:
            cur.execute(
                "INSERT INTO prefixrag.collections (name, created_seq) VALUES (%s, %s) "
                "ON CONFLICT (name) DO NOTHING",
                (w.collection, position),
            )
        cur.executemany(
            "INSERT INTO prefixrag.documents (collection, doc_id, body, digest, chunk_ids, seq, created_seq) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (collection, doc_id) DO UPDATE SET "
            "body = EXCLUDED.body, digest = EXCLUDED.digest, chunk_ids = EXCLUDED.chunk_ids, seq = EXCLUDED.seq",
            [
                (w.collection, w.document.id, Jsonb(w.document.model_dump(mode="json")), w.digest,
                 [r.chunk_id for r in w.chunks], p, p)
                for w, p in changed
            ],
        )  # fmt: skip
        cur.execute(
            "DELETE FROM prefixrag.chunks c USING unnest(%s::text[], %s::text[]) AS k (collection, doc_id) "
            "WHERE c.collection = k.collection AND c.doc_id = k.doc_id",
            ([w.collection for w, _ in changed], [w.document.id for w, _ in changed]),
        )
        with cur.copy(
            "COPY prefixrag.chunks (collection, chunk_id, doc_id, ord, body, dim, vectors) FROM STDIN"
        ) as copy:
            for w, _ in changed:
                for ord_, (record, (dim, data)) in enumerate(zip(w.chunks, encoded[w.key], strict=True)):
                    body = Jsonb(record.chunk.model_dump(mode="json"))
                    copy.write_row((w.collection, record.chunk_id, w.document.id, ord_, body, dim, data))
        extra = [
            (w.collection, r.chunk_id, name, *encode(v))
            for w, _ in changed
            for r in w.chunks
            for name, v in r.extra.items()
        ]
        if extra:
            with cur.copy(
                "COPY prefixrag.chunk_vectors (collection, chunk_id, name, dim, vectors) FROM STDIN"
            ) as copy:
                for row in extra:
                    copy.write_row(row)
        cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(changed[-1][1])))
    return positions


def _stored_digests(conn: psycopg.Connection, keys: Sequence[Key]) -> dict[Key, tuple[str, int]]:
    rows = conn.execute(
        "SELECT collection, doc_id, digest, seq FROM prefixrag.documents "
        "JOIN unnest(%s::text[], %s::text[]) AS k (collection, doc_id) USING (collection, doc_id)",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(c, d): (digest, int(seq)) for c, d, digest, seq in rows}


def delete_document(conn: psycopg.Connection, collection: str, doc_id: str) -> tuple[bool, int]:
    """Delete a document (its chunks go with it) and log it: (whether it was there, the position of
    its absence: this delete's, or the latest change of a document already gone, 0 if never seen)."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
    with conn.cursor() as cur:
        cur.execute(
            "DELETE FROM prefixrag.documents WHERE collection = %s AND doc_id = %s RETURNING doc_id",
            (collection, doc_id),
        )
        if cur.fetchone() is None:
            return False, _latest_positions(conn, [(collection, doc_id)]).get((collection, doc_id), 0)
        position = _log(cur, collection, doc_id, "delete")
        cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(position)))
    return True, position


def _log(cur: psycopg.Cursor[Any], collection: str, doc_id: str, op: str) -> int:
    cur.execute(
        "INSERT INTO prefixrag.changes (collection, doc_id, op) VALUES (%s, %s, %s) RETURNING seq",
        (collection, doc_id, op),
    )
    row = cur.fetchone()
    assert row is not None
    return int(row[0])


# ---- reads ----------------------------------------------------------------------------------------


def read_documents(conn: psycopg.Connection, keys: Sequence[Key]) -> dict[Key, tuple[DocumentWrite, int]]:
    """The stored documents among ``keys``, each with the position of its latest change."""
    if not keys:
        return {}
    args = ([k[0] for k in keys], [k[1] for k in keys])
    join = "JOIN unnest(%s::text[], %s::text[]) AS k (collection, doc_id) USING (collection, doc_id)"
    docs = conn.execute(
        f"SELECT collection, doc_id, body, digest, chunk_ids, seq FROM prefixrag.documents {join}", args
    ).fetchall()
    chunks = conn.execute(
        f"SELECT collection, doc_id, chunk_id, body, dim, vectors FROM prefixrag.chunks {join}", args
    ).fetchall()
    extra = conn.execute(
        "SELECT v.collection, v.chunk_id, v.name, v.dim, v.vectors FROM prefixrag.chunk_vectors v "
        "JOIN prefixrag.chunks c USING (collection, chunk_id) "
        "JOIN unnest(%s::text[], %s::text[]) AS k (collection, doc_id) "
        "ON c.collection = k.collection AND c.doc_id = k.doc_id",
        args,
    ).fetchall()
    records = _chunk_records(((c, ch, body, dim, data) for c, _, ch, body, dim, data in chunks), extra)
    found = {}
    for collection, doc_id, body, digest, chunk_ids, seq in docs:
        write = DocumentWrite(
            collection,
            Document.model_validate(body),
            digest,
            tuple(records[(collection, chunk_id)] for chunk_id in chunk_ids),
        )
        found[(collection, doc_id)] = (write, int(seq))
    return found


def changes_since(conn: psycopg.Connection, position: int, applied: Callable[[str, str], int]) -> ChangeBatch:
    """Up to a batch of changes after ``position`` with the documents' states now (one snapshot);
    states ``applied`` says a reader holds already (at that position or later) are not read again."""
    rows = conn.execute(
        "SELECT seq, collection, doc_id FROM prefixrag.changes WHERE seq > %s ORDER BY seq LIMIT %s",
        (position, _BATCH),
    ).fetchall()
    if not rows:
        return ChangeBatch(position, [])
    latest: dict[Key, int] = {}
    for seq, collection, doc_id in rows:
        latest.pop((collection, doc_id), None)
        latest[(collection, doc_id)] = int(seq)
    wanted = [key for key, seq in latest.items() if applied(*key) < seq]
    states = read_documents(conn, wanted)
    gone = [key for key in wanted if key not in states]
    deleted_at = _latest_positions(conn, gone)
    changes = []
    for key in wanted:
        state = states.get(key)
        if state is not None:
            changes.append(Change(state[1], key[0], key[1], state[0]))
        else:
            changes.append(Change(deleted_at.get(key, latest[key]), key[0], key[1], None))
    return ChangeBatch(int(rows[-1][0]), changes)


def _latest_positions(conn: psycopg.Connection, keys: Sequence[Key]) -> dict[Key, int]:
    if not keys:
        return {}
    rows = conn.execute(
        "SELECT c.collection, c.doc_id, max(c.seq) FROM prefixrag.changes c "
        "JOIN unnest(%s::text[], %s::text[]) AS k (collection, doc_id) USING (collection, doc_id) "
        "GROUP BY c.collection, c.doc_id",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(c, d): int(s) for c, d, s in rows}


def list_documents(conn: psycopg.Connection, collections: Sequence[str] | None) -> list[DocumentInfo]:
    """Every stored document of ``collections`` (None: all), collection by collection, oldest first."""
    where = "" if collections is None else "WHERE d.collection = ANY(%s)"
    rows = conn.execute(
        "SELECT d.collection, d.body, cardinality(d.chunk_ids) FROM prefixrag.documents d "
        f"JOIN prefixrag.collections c ON c.name = d.collection {where} "
        "ORDER BY c.created_seq, d.created_seq",
        () if collections is None else (list(collections),),
    ).fetchall()
    infos = [
        DocumentInfo(str(b["id"]), dict(b.get("metadata") or {}), int(n), len(b["text"]), str(c))
        for c, b, n in rows
    ]
    if collections is None:
        return infos
    order = {name: i for i, name in enumerate(collections)}
    return sorted(infos, key=lambda info: order[info.collection])


# ---- loading a whole store ------------------------------------------------------------------------


@dataclass
class Loaded:
    """A whole store read in one snapshot: each collection's parts and documents' positions."""

    position: int
    collections: dict[str, tuple[CollectionParts, list[int]]]


def load_all(conn: psycopg.Connection, new_index: Callable[[int], VectorIndex]) -> Loaded:
    """Everything the store holds (call inside a REPEATABLE READ transaction), streamed."""
    row = conn.execute("SELECT coalesce(max(seq), 0) FROM prefixrag.changes").fetchone()
    position = int(row[0]) if row else 0
    names = [r[0] for r in conn.execute("SELECT name FROM prefixrag.collections ORDER BY created_seq")]
    docs: dict[str, list[tuple[DocumentRecord, int]]] = defaultdict(list)
    with conn.cursor(name="prefixrag_documents") as cur:
        cur.itersize = _ITERSIZE
        cur.execute(
            "SELECT collection, body, digest, chunk_ids, seq FROM prefixrag.documents ORDER BY created_seq"
        )
        for collection, body, digest, chunk_ids, seq in cur:
            docs[collection].append(
                (DocumentRecord(Document.model_validate(body), digest, list(chunk_ids)), int(seq))
            )
    extra = conn.execute(
        "SELECT collection, chunk_id, name, dim, vectors FROM prefixrag.chunk_vectors"
    ).fetchall()
    found: dict[str, dict[str, tuple[Chunk, np.ndarray]]] = defaultdict(dict)
    with conn.cursor(name="prefixrag_chunks", binary=True) as cur:
        cur.itersize = _ITERSIZE
        cur.execute("SELECT collection, chunk_id, body, dim, vectors FROM prefixrag.chunks")
        for collection, chunk_id, body, dim, data in cur:
            found[collection][chunk_id] = (Chunk.model_validate(body), decode(dim, data))
    extra_by: dict[str, dict[str, dict[str, np.ndarray]]] = defaultdict(lambda: defaultdict(dict))
    for collection, chunk_id, name, dim, data in extra:
        extra_by[collection][name][chunk_id] = decode(dim, data)
    loaded = {}
    for name in names:
        if not docs.get(name):
            continue
        records = [r for r, _ in docs[name]]
        # chunks in document order, then text order: every replica that loads builds the same indexes
        ordered = [(chunk_id, found[name][chunk_id]) for r in records for chunk_id in r.chunk_ids]
        index = new_index(ordered[0][1][1].shape[1])
        keys = [chunk_id for chunk_id, (_, vectors) in ordered for _ in range(len(vectors))]
        index.add(keys, np.concatenate([vectors for _, (_, vectors) in ordered]))
        chunks = {chunk_id: chunk for chunk_id, (chunk, _) in ordered}
        parts = CollectionParts(records, chunks, index, {k: dict(v) for k, v in extra_by[name].items()})
        loaded[name] = (parts, [p for _, p in docs[name]])
    return Loaded(position, loaded)


def _chunk_records(
    chunks: Iterable[tuple[str, str, Any, int, bytes]], extra: Iterable[tuple[str, str, str, int, bytes]]
) -> dict[Key, ChunkRecord]:
    extras: dict[Key, dict[str, np.ndarray]] = defaultdict(dict)
    for collection, chunk_id, name, dim, data in extra:
        extras[(collection, chunk_id)][name] = decode(dim, data)
    return {
        (collection, chunk_id): ChunkRecord(
            Chunk.model_validate(body), decode(dim, data), extras.get((collection, chunk_id), {})
        )
        for collection, chunk_id, body, dim, data in chunks
    }
