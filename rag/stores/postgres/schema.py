"""The document store's tables (schema ``prefixrag``), created on first use, and its recorded config.

    meta           key -> JSON: the schema version, the ingest-time settings the vectors were made with
    collections    name, the log position that created it (creation order)
    documents      (collection, doc_id): the document as JSON, its digest, its chunk ids in text order,
                   the position of its latest change (seq) and of its creation (listing order)
    chunks         (collection, chunk_id): the chunk as JSON, its vectors as float32 little-endian rows
                   (bytea; no pickle), deleted with its document
    chunk_vectors  (collection, chunk_id, name): extra named vector sets of a chunk, same encoding
    changes        the ordered change log: seq (bigserial), collection, doc_id, op ('put'/'delete')

Writers take ``WRITE_LOCK`` (a transaction-scoped advisory lock) before drawing a ``seq``, so the
log's order is its commit order: a reader that has seen position p has seen every change up to p.
Nothing here needs an extension (pgvector is not used).

Example:
    >>> with connect(url) as conn:                 # doctest: +SKIP
    ...     ensure_schema(conn); recorded_config(conn)
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

SCHEMA_VERSION = 1
CHANNEL = "prefixrag_changes"  # NOTIFY channel: a committed write's position
WRITE_LOCK = 0x70726678  # advisory lock key held by every writing transaction until it commits
_DDL_LOCK = 0x70726679

_DDL = """
CREATE SCHEMA IF NOT EXISTS prefixrag;
CREATE TABLE IF NOT EXISTS prefixrag.meta (key text PRIMARY KEY, value jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS prefixrag.collections (name text PRIMARY KEY, created_seq bigint NOT NULL);
CREATE TABLE IF NOT EXISTS prefixrag.documents (
    collection text NOT NULL REFERENCES prefixrag.collections (name),
    doc_id text NOT NULL,
    body jsonb NOT NULL,
    digest text NOT NULL,
    chunk_ids text[] NOT NULL,
    seq bigint NOT NULL,
    created_seq bigint NOT NULL,
    PRIMARY KEY (collection, doc_id)
);
CREATE TABLE IF NOT EXISTS prefixrag.chunks (
    collection text NOT NULL,
    chunk_id text NOT NULL,
    doc_id text NOT NULL,
    ord integer NOT NULL,
    body jsonb NOT NULL,
    dim integer NOT NULL,
    vectors bytea NOT NULL,
    PRIMARY KEY (collection, chunk_id),
    FOREIGN KEY (collection, doc_id) REFERENCES prefixrag.documents (collection, doc_id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS chunks_by_document ON prefixrag.chunks (collection, doc_id);
CREATE TABLE IF NOT EXISTS prefixrag.chunk_vectors (
    collection text NOT NULL,
    chunk_id text NOT NULL,
    name text NOT NULL,
    dim integer NOT NULL,
    vectors bytea NOT NULL,
    PRIMARY KEY (collection, chunk_id, name),
    FOREIGN KEY (collection, chunk_id) REFERENCES prefixrag.chunks (collection, chunk_id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS prefixrag.changes (
    seq bigserial PRIMARY KEY,
    collection text NOT NULL,
    doc_id text NOT NULL,
    op text NOT NULL CHECK (op IN ('put', 'delete')),
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS changes_by_document ON prefixrag.changes (collection, doc_id, seq);
"""


class SchemaMismatch(ValueError):
    """The database holds a newer store schema than this version of prefixrag knows."""


def ensure_schema(conn: psycopg.Connection) -> None:
    """Create the tables if missing (concurrent starters serialize on an advisory lock) and check the
    schema version."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
        conn.execute(_DDL)
        conn.execute(
            "INSERT INTO prefixrag.meta (key, value) VALUES ('schema', %s) ON CONFLICT (key) DO NOTHING",
            (Jsonb(SCHEMA_VERSION),),
        )
        row = conn.execute("SELECT value FROM prefixrag.meta WHERE key = 'schema'").fetchone()
    found = row[0] if row else None
    if found != SCHEMA_VERSION:
        raise SchemaMismatch(
            f"the database holds document store schema {found!r}; this prefixrag reads schema {SCHEMA_VERSION}"
        )


def record_config(conn: psycopg.Connection, fields: dict[str, Any]) -> dict[str, Any]:
    """The ingest-time settings the store records: ``fields`` if it recorded none yet (the first
    opener's), else the ones it holds."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO prefixrag.meta (key, value) VALUES ('config', %s) ON CONFLICT (key) DO NOTHING",
            (Jsonb(fields),),
        )
        row = conn.execute("SELECT value FROM prefixrag.meta WHERE key = 'config'").fetchone()
    assert row is not None
    recorded: dict[str, Any] = row[0]
    return recorded
