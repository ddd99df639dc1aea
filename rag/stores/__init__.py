"""Document stores: where a knowledge base keeps its documents (``DocumentStore``), one module per
backend: ``rag.stores.local`` (the local index directory, the default) and ``rag.stores.postgres``
(PostgreSQL, shared by many replicas). ``open_store`` picks the one a config names.

Example:
    >>> open_store(RAGConfig()).location                                    # doctest: +SKIP
    'memory'
    >>> open_store(RAGConfig(document_store="postgresql://db/rag")).backend  # doctest: +SKIP
    'postgresql'
"""

from __future__ import annotations

from rag.config import RAGConfig
from rag.stores.local import LocalStore
from rag.stores.protocol import (
    Change,
    ChangeBatch,
    ChunkRecord,
    DocumentStore,
    DocumentWrite,
    StoreError,
    StoreLocked,
    StoreStatus,
    StoreUnavailable,
)

__all__ = [
    "Change",
    "ChangeBatch",
    "ChunkRecord",
    "DocumentStore",
    "DocumentWrite",
    "LocalStore",
    "StoreError",
    "StoreLocked",
    "StoreStatus",
    "StoreUnavailable",
    "open_store",
    "probe_store",
]


def open_store(config: RAGConfig) -> DocumentStore:
    """The store ``config`` names: ``document_store`` (a PostgreSQL URL), else the local index
    directory ``index_dir`` (None: in memory)."""
    if config.document_store is not None:
        from rag.stores.postgres import PostgresStore

        return PostgresStore(config.document_store)
    return LocalStore(config.index_dir)


def probe_store(config: RAGConfig) -> None:
    """StoreError naming the problem when the store ``config`` names cannot take writes now (a local
    directory another process writes, a database that refuses or does not answer)."""
    if config.document_store is not None:
        from rag.stores.postgres import probe

        probe(config.document_store)
    elif config.index_dir is not None:
        from rag.stores.local.lock import DirectoryLock

        with DirectoryLock(config.index_dir):
            pass
