"""The local index directory backend: versioned files on disk, one writer (``LocalStore``)."""

from rag.stores.local.store import LocalStore

__all__ = ["LocalStore"]
