"""PostgresStore: PostgreSQL as the store of record that many replicas share.

Every write (the documents, all their chunks and vectors, the log entries) is one transaction,
acknowledged only after it commits, and applied to this replica's indexes at once (read your
writes). Other replicas' writes arrive through the change log (``rag.stores.postgres.follow``): a
LISTEN/NOTIFY wake-up, with polling as the fallback. Embeddings are computed by the writer and
stored; a follower reads them, never re-embeds. So are the embedding reranker's window vectors
(the chunks' extra vector sets, ``chunk_vectors``) that a writer computes at ingestion; the ones a
chunk stored without them gets later (``KnowledgeBase.window_vectors``, ``fill_windows``) are
computed by each replica and held in its memory only, never written back. While the database does not answer, searches go on
from what this replica holds, writes raise ``StoreUnavailable`` (the API answers 503 with
Retry-After), and the store reconnects by itself; a wrong URL or credentials fail at open, naming
the problem. Nothing depends on pgvector.

Example:
    >>> store = PostgresStore("postgresql://rag:secret@127.0.0.1:5432/rag")   # doctest: +SKIP
    >>> kb = KnowledgeBase(RAGConfig(), store=store)                          # doctest: +SKIP
    >>> kb.add_documents([Document(id="a", text="...")], collection="alice")   # doctest: +SKIP
    ['a']
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import psycopg

from rag.config import RAGConfig, check_store_url
from rag.stores.compat import check_compatible, ingest_settings, saved_config
from rag.stores.indexes import SearchIndexes
from rag.stores.local.store import export_index
from rag.stores.postgres import rows
from rag.stores.postgres.connect import connect, describe, where
from rag.stores.postgres.follow import Follower
from rag.stores.postgres.schema import SchemaMismatch, ensure_schema, record_config
from rag.stores.protocol import ChangeBatch, DocumentWrite, StoreError, StoreStatus, StoreUnavailable
from rag.types import DocumentInfo

T = TypeVar("T")
RETRY_AFTER_S = 2.0


def probe(url: str) -> None:
    """StoreError naming the problem if the database at ``url`` refuses us or does not answer."""
    try:
        with connect(check_store_url(url)) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise StoreError(f"cannot open the document store {where(url)}: {describe(exc)}") from None


class PostgresStore:
    """Documents, chunks, vectors and the change log in PostgreSQL (schema ``prefixrag``).

    ``poll_s``: how often the follower looks at the log when no notification came.

    Example:
        >>> PostgresStore("postgresql://rag:secret@db:5432/rag", connect_now=False).location
        'postgresql://rag:***@db:5432/rag'
    """

    backend = "postgresql"

    def __init__(self, url: str, *, poll_s: float = 0.5, connect_now: bool = True) -> None:
        self.url = check_store_url(url)
        self.poll_s = poll_s
        self._conn: psycopg.Connection | None = None
        self._conn_lock = threading.Lock()  # one statement stream on the writer connection
        self._indexes: SearchIndexes | None = None
        self._follower: Follower | None = None
        self._error: str | None = None  # the last call's failure, until one succeeds
        self._error_at = 0.0
        if connect_now:
            self._open()

    @property
    def location(self) -> str:
        return where(self.url)

    # -- opening ----------------------------------------------------------------------------------
    def check_config(self, config: RAGConfig) -> RAGConfig:
        recorded = self._call(lambda conn: record_config(conn, ingest_settings(config)), opening=True)
        return check_compatible(config, saved_config(recorded), self.location)

    def attach(self, indexes: SearchIndexes) -> None:
        self._indexes = indexes

        def load(conn: psycopg.Connection) -> rows.Loaded:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                return rows.load_all(conn, indexes.new_index)

        loaded = self._call(load, opening=True)
        indexes.replace({})
        for name, (parts, positions) in loaded.collections.items():
            indexes.adopt(name, parts, positions)
        self._follower = Follower(self, indexes, loaded.position, poll_s=self.poll_s)
        self._follower.start()

    def claim(self) -> None:
        """Nothing to claim: any number of replicas write a PostgreSQL store."""

    # -- writes -----------------------------------------------------------------------------------
    def write(self, writes: Sequence[DocumentWrite]) -> int:
        if not writes:
            return self.position
        indexes = self._attached()
        indexes.check(writes)  # what this replica could not index is not stored either

        def transaction(conn: psycopg.Connection) -> list[int]:
            with conn.transaction():
                return rows.write_documents(conn, writes)

        positions = self._call(transaction)
        for write, position in zip(writes, positions, strict=True):
            indexes.apply(write, position)  # also a state the store held already: read your writes
        return max(positions)

    def delete(self, collection: str, doc_id: str) -> bool:
        indexes = self._attached()

        def transaction(conn: psycopg.Connection) -> tuple[bool, int]:
            with conn.transaction():
                return rows.delete_document(conn, collection, doc_id)

        deleted, position = self._call(transaction)
        if position:  # gone from the store, so gone here too (perhaps ahead of the log)
            indexes.apply_delete(collection, doc_id, position)
        return deleted

    # -- reads ------------------------------------------------------------------------------------
    def read(self, collection: str, doc_id: str) -> DocumentWrite | None:
        found = self._call(lambda conn: rows.read_documents(conn, [(collection, doc_id)]))
        state = found.get((collection, doc_id))
        return state[0] if state else None

    def list_documents(self, collections: Iterable[str] | None = None) -> list[DocumentInfo]:
        names = None if collections is None else list(collections)
        return self._call(lambda conn: rows.list_documents(conn, names))

    def changes_since(self, position: int, applied: Callable[[str, str], int] | None = None) -> ChangeBatch:
        """Changes after ``position``; ``applied`` (what a reader holds) skips states it has."""
        known = applied or (lambda collection, doc_id: 0)

        def snapshot(conn: psycopg.Connection) -> ChangeBatch:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                return rows.changes_since(conn, position, known)

        return self._call(snapshot)

    @property
    def position(self) -> int:
        """How far this replica has followed the log."""
        return self._follower.position if self._follower is not None else 0

    def save(self, directory: Path | None = None, config: RAGConfig | None = None) -> Path:
        if directory is None:
            raise ValueError("a PostgreSQL store has no directory of its own: name one to save a copy in")
        return export_index(self._attached(), Path(directory), config or RAGConfig())

    def status(self) -> StoreStatus:
        """Unreachable while the follower cannot read the log, or since a call failed and the
        follower has not read the log again."""
        follower = self._follower
        error = follower.error if follower is not None else None
        if (
            error is None
            and self._error is not None
            and (follower is None or follower.last_ok < self._error_at)
        ):
            error = self._error
        return StoreStatus(self.backend, self.location, error is None, self.position, error)

    def close(self) -> None:
        if self._follower is not None:
            self._follower.stop()
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- connections ------------------------------------------------------------------------------
    def _open(self) -> None:
        try:
            with self._conn_lock:
                self._conn = connect(self.url, autocommit=True)
                ensure_schema(self._conn)
        except SchemaMismatch as exc:
            raise StoreError(f"{self.location}: {exc}") from None
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the document store {self.location}: {describe(exc)}") from None

    def _call(self, work: Callable[[psycopg.Connection], T], *, opening: bool = False) -> T:
        """Run ``work`` on the writer connection; a broken connection is replaced and the work tried
        once more (every write is a whole-document state, so repeating one is harmless), then
        StoreUnavailable (or StoreError while opening)."""
        last: psycopg.Error | None = None
        for _ in range(2):
            try:
                with self._connection() as conn:
                    result = work(conn)
                self._error = None
                return result
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                last = exc
        assert last is not None
        reason = describe(last)
        self._error = f"the document store {self.location} is unreachable: {reason}"
        self._error_at = time.monotonic()
        if opening:
            raise StoreError(f"cannot open the document store {self.location}: {reason}") from None
        raise StoreUnavailable(self._error, retry_after_s=RETRY_AFTER_S) from None

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        with self._conn_lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = None
                self._conn = connect(self.url, autocommit=True)  # transactions are explicit
            try:
                yield self._conn
            except (psycopg.OperationalError, psycopg.InterfaceError):
                self._conn.close()
                self._conn = None
                raise

    def _attached(self) -> SearchIndexes:
        if self._indexes is None:
            raise RuntimeError("attach the store to its indexes first")
        return self._indexes
