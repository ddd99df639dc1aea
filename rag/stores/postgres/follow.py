"""Follower: keeps one replica's indexes in step with the store's change log.

A thread with its own connection LISTENs on the store's channel; every notification (a committed
write's position), and every ``poll_s`` without one, it reads the changes after its position in one
snapshot and applies them. A state this replica already holds (its own writes, applied when they
committed) is not read again. When the database goes away the thread reports the error, waits a
little longer each time, reconnects and catches up from where it was: the log has everything, so
nothing is missed and nothing is loaded twice.

Example:
    >>> follower = Follower(store, indexes, position=41, poll_s=0.5).start()   # doctest: +SKIP
    >>> follower.wait_for(42, timeout_s=1.0)                                    # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import psycopg

from rag.stores.indexes import SearchIndexes
from rag.stores.postgres import rows
from rag.stores.postgres.connect import connect, describe
from rag.stores.postgres.schema import CHANNEL

if TYPE_CHECKING:
    from rag.stores.postgres.store import PostgresStore

log = logging.getLogger(__name__)
_MAX_BACKOFF_S = 2.0


class Follower:
    """The log reader of one replica (a daemon thread; ``stop`` ends it).

    Example:
        >>> follower.position, follower.error          # doctest: +SKIP
        (128, None)
    """

    def __init__(self, store: PostgresStore, indexes: SearchIndexes, position: int, *, poll_s: float) -> None:
        self.store = store
        self.indexes = indexes
        self.position = position
        self.poll_s = poll_s
        self.error: str | None = None
        self.last_ok = time.monotonic()  # when the log was last read
        self._stop = threading.Event()
        self._moved = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="prefixrag-store-follower", daemon=True)

    def start(self) -> Follower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 + self.poll_s)

    def wait_for(self, position: int, timeout_s: float) -> bool:
        """True once the log has been applied up to ``position`` (within ``timeout_s``)."""
        with self._moved:
            return self._moved.wait_for(lambda: self.position >= position, timeout=timeout_s)

    # -- the thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                with connect(self.store.url, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._catch_up(conn)
                    backoff = 0.1
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=self.poll_s, stop_after=1):
                            pass
                        self._catch_up(conn)
            except psycopg.Error as exc:
                reason = f"the document store {self.store.location} is unreachable: {describe(exc)}"
                if reason != self.error:
                    log.warning("%s; following again once it answers", reason)
                self.error = reason
                self._stop.wait(backoff)
                backoff = min(2 * backoff, _MAX_BACKOFF_S)
            except Exception:  # a bug must not stop following silently
                log.exception("the store follower failed; starting again")
                self._stop.wait(_MAX_BACKOFF_S)

    def _catch_up(self, conn: psycopg.Connection) -> None:
        """Apply every change after our position (in batches), then report the new position."""
        while True:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                batch = rows.changes_since(conn, self.position, self.indexes.applied)
            for change in batch.changes:
                if change.state is None:
                    self.indexes.apply_delete(change.collection, change.doc_id, change.position)
                else:
                    self.indexes.apply(change.state, change.position)
            if self.error is not None:
                log.warning("the document store %s answers again", self.store.location)
            self.error = None
            self.last_ok = time.monotonic()
            moved = batch.position > self.position
            with self._moved:
                self.position = batch.position
                self._moved.notify_all()
            if not moved:  # else a batch may have stopped short of the log's end
                return
