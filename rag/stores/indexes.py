"""SearchIndexes: the in-memory search state every document store fills, one Collection per name.

Stores apply whole documents (``DocumentWrite``: the document, its chunks, their vectors) at a
position of their log; a state older than the one a document already shows is ignored, so a writer's
own write and the same change arriving through the log may land in either order.

Example:
    >>> indexes = SearchIndexes(lambda dim: VectorIndex(dim, kind="flat"), lambda: 2, lambda c: c.text)  # doctest: +SKIP
    >>> indexes.apply(write, position=1)                    # doctest: +SKIP
    True
    >>> [info.id for info in indexes.get("alice").infos()]  # doctest: +SKIP
    ['notes.md']
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from rag.retrieval.index import VectorIndex
from rag.stores.collection import Collection, CollectionParts, SearchText
from rag.stores.protocol import DocumentWrite

__all__ = ["SearchIndexes"]


class SearchIndexes:
    """Every collection's in-memory indexes, and the log position each document was last applied at.

    ``lock`` guards every read and write (readers hold it for a whole search). ``generation`` moves
    whenever a collection is created or replaced, so whoever caches objects built over the
    collections (retrievers) knows to rebuild them.

    Example:
        >>> indexes = SearchIndexes(lambda dim: VectorIndex(dim), lambda: 384, lambda c: c.text)
        >>> indexes.names(), indexes.generation
        ([], 0)
    """

    def __init__(
        self,
        new_index: Callable[[int], VectorIndex],
        default_dim: Callable[[], int],
        search_text: SearchText,
    ) -> None:
        self.lock = threading.RLock()
        self.collections: dict[str, Collection] = {}
        self.generation = 0
        self._new_index = new_index
        self._default_dim = default_dim
        self.search_text = search_text
        self._applied: dict[tuple[str, str], int] = {}  # (collection, doc id) -> position, deletions too

    # -- reads ------------------------------------------------------------------------------------
    def get(self, name: str) -> Collection | None:
        return self.collections.get(name)

    def names(self) -> list[str]:
        """Collections holding at least one document, in creation order."""
        with self.lock:
            return [name for name, coll in self.collections.items() if len(coll)]

    def select(self, names: Sequence[str] | None) -> list[Collection]:
        """The existing collections among ``names`` (validated, each once), all when None."""
        with self.lock:
            if names is None:
                return list(self.collections.values())
            return [self.collections[n] for n in names if n in self.collections]

    def record(self, collection: str, doc_id: str) -> DocumentWrite | None:
        with self.lock:
            coll = self.collections.get(collection)
            return coll.record(doc_id) if coll is not None else None

    def applied(self, collection: str, doc_id: str) -> int:
        """The log position a document's state here comes from (0: never seen)."""
        return self._applied.get((collection, doc_id), 0)

    def check(self, writes: Sequence[DocumentWrite]) -> None:
        """ValueError naming the first write these indexes could not take (vectors not [n >= 1, dim]
        float rows, or of another dim than the collection's): a store checks before it stores."""
        with self.lock:
            for write in writes:
                coll = self.collections.get(write.collection)
                dim = coll.dim if coll is not None else None
                for record in write.chunks:
                    shape = np.shape(record.vectors)
                    if (
                        len(shape) != 2
                        or not shape[0]
                        or (dim is not None and shape[1] != dim)
                        or not shape[1]
                    ):
                        want = f"[n, {dim}]" if dim is not None else "[n, dim]"
                        raise ValueError(
                            f"document {write.document.id!r}: chunk {record.chunk_id!r} has vectors of "
                            f"shape {list(shape)}, expected {want} with n >= 1"
                        )
                    dim = shape[1] if dim is None else dim

    # -- writes -----------------------------------------------------------------------------------
    def apply(self, write: DocumentWrite, position: int) -> bool:
        """Make a document ``write`` unless this holds a newer state of it; True if applied."""
        with self.lock:
            if self._applied.get(write.key, 0) > position:
                return False
            self._applied[write.key] = position
            self._collection(write.collection).put(write)
            return True

    def apply_delete(self, collection: str, doc_id: str, position: int) -> bool:
        """Remove a document unless this holds a newer state of it; True if it was here."""
        with self.lock:
            if self._applied.get((collection, doc_id), 0) > position:
                return False
            self._applied[(collection, doc_id)] = position
            coll = self.collections.get(collection)
            return coll is not None and coll.delete(doc_id)

    def adopt(self, name: str, parts: CollectionParts, positions: Sequence[int] | None = None) -> None:
        """Replace collection ``name`` with what a store loaded; ``positions``: each document's log
        position, in ``parts.records`` order (None: 0, a store without a log)."""
        with self.lock:
            coll = self._new_collection(name)
            coll.adopt(parts)
            self.collections[name] = coll
            if positions is not None:
                for record, position in zip(parts.records, positions, strict=True):
                    self._applied[(name, record.doc.id)] = position
            self.generation += 1

    def replace(self, parts: dict[str, CollectionParts]) -> None:
        """Hold exactly these collections (a store read again from its files)."""
        with self.lock:
            self.collections = {}
            self._applied = {}
            self.generation += 1
            for name, collection in parts.items():
                self.adopt(name, collection)

    def _collection(self, name: str) -> Collection:
        coll = self.collections.get(name)
        if coll is None:
            coll = self.collections[name] = self._new_collection(name)
            self.generation += 1
        return coll

    def _new_collection(self, name: str) -> Collection:
        return Collection(name, self._new_index, self._default_dim, self.search_text)

    def new_index(self, dim: int) -> VectorIndex:
        return self._new_index(dim)
