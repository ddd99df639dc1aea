"""LocalStore: the local index directory, the embedded default (no server).

The documents live in this process's ``SearchIndexes``; a store bound to a directory writes a new
crash-safe version there (``rag.stores.local.versions``, format ``rag.stores.local.format``) on every
write before it returns, so an acknowledged write survives a crash, and a failed write is undone in
memory too. Without a directory it is memory only (``save`` exports a directory). One process writes a
directory at a time (``rag.stores.local.lock``); the second gets ``StoreLocked`` naming the shared
store to use instead. Positions count this process's writes (nobody else writes here, so there is
nothing to follow).

Example:
    >>> store = LocalStore("my-index")                       # doctest: +SKIP
    >>> kb = KnowledgeBase(RAGConfig(), store=store)          # doctest: +SKIP
    >>> kb.add_documents([Document(id="a", text="...")])      # doctest: +SKIP
    ['a']
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from rag.config import RAGConfig
from rag.stores.compat import check_compatible
from rag.stores.indexes import SearchIndexes
from rag.stores.local.format import collection_folders, read_config, read_index, write_index
from rag.stores.local.lock import DirectoryLock
from rag.stores.local.versions import current_version, save_version
from rag.stores.protocol import Change, ChangeBatch, DocumentWrite, StoreStatus
from rag.types import DocumentInfo


class LocalStore:
    """Documents in memory, saved as a versioned local index directory (when given one).

    Example:
        >>> LocalStore().location, LocalStore("/srv/index").location
        ('memory', '/srv/index')
    """

    backend = "local"

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, must_exist: bool = False) -> None:
        self.directory = Path(directory).expanduser() if directory is not None else None
        if must_exist:
            current_version(self._root())  # FileNotFoundError naming the directory
        self._lock = DirectoryLock(self.directory) if self.directory is not None else None
        self._config = RAGConfig()
        self._indexes: SearchIndexes | None = None
        self._saved: dict[str, tuple[Path, int]] = {}  # name -> (folder last saved to, changes then)
        self._seen: str | None = None  # the version of our directory the indexes hold
        self._position = 0
        self._log: dict[tuple[str, str], int] = {}  # document -> its latest position, oldest first

    @property
    def location(self) -> str:
        return str(self.directory) if self.directory is not None else "memory"

    # -- opening ----------------------------------------------------------------------------------
    def saved_config(self) -> RAGConfig | None:
        """The config the directory's live version was saved with (None: nothing saved yet)."""
        version = self._version()
        return read_config(version) if version is not None else None

    def check_config(self, config: RAGConfig) -> RAGConfig:
        version = self._version()
        if version is not None:
            config = check_compatible(config, read_config(version), version)
        if self.directory is not None:
            config = config.model_copy(update={"index_dir": self.directory})
        self._config = config
        return config

    def attach(self, indexes: SearchIndexes) -> None:
        self._indexes = indexes
        self._reload()

    def claim(self) -> None:
        """Take the directory's writer lock; if another writer saved since this store read it, read
        the directory again first (writes go on top of the latest version, never over it)."""
        if self._lock is None or self._lock.held:
            return
        self._lock.acquire()
        version = self._version()
        if (version.name if version is not None else None) != self._seen:
            self._reload()

    # -- writes -----------------------------------------------------------------------------------
    def write(self, writes: Sequence[DocumentWrite]) -> int:
        indexes = self._attached()
        self._claim_directory()
        with indexes.lock:
            writes = [w for w in writes if _changed(indexes, w)]
            if not writes:
                return self._position
            indexes.check(writes)
            previous = [(w.key, indexes.record(*w.key)) for w in writes]
            positions = []
            try:
                for write in writes:
                    positions.append(self._next())
                    indexes.apply(write, positions[-1])
                self._persist()
            except BaseException:
                self._undo(previous)
                raise
            for write, position in zip(writes, positions, strict=True):
                self._logged(write.key, position)
            return self._position

    def delete(self, collection: str, doc_id: str) -> bool:
        indexes = self._attached()
        self._claim_directory()
        with indexes.lock:
            previous = indexes.record(collection, doc_id)
            if previous is None:
                return False
            position = self._next()
            indexes.apply_delete(collection, doc_id, position)
            try:
                self._persist()
            except BaseException:
                self._undo([((collection, doc_id), previous)])
                raise
            self._logged((collection, doc_id), position)
            return True

    def save(self, directory: Path | None = None, config: RAGConfig | None = None) -> Path:
        """Write a version now: into the store's own directory (``None``), or a copy elsewhere."""
        if config is not None:
            self._config = config
        target = Path(directory).expanduser() if directory is not None else self.directory
        if target is None:
            raise ValueError("save needs a directory (argument or RAGConfig.index_dir), got None")
        with self._attached().lock:
            if self.directory is not None and _same(target, self.directory):
                self.claim()
                return self._save_to(target)
            with DirectoryLock(target):
                return self._save_to(target)

    # -- reads ------------------------------------------------------------------------------------
    def read(self, collection: str, doc_id: str) -> DocumentWrite | None:
        return self._attached().record(collection, doc_id)

    def list_documents(self, collections: Iterable[str] | None = None) -> list[DocumentInfo]:
        selected = None if collections is None else list(collections)
        return [info for coll in self._attached().select(selected) for info in coll.infos()]

    def changes_since(self, position: int) -> ChangeBatch:
        indexes = self._attached()
        with indexes.lock:
            newer = sorted((p, key) for key, p in self._log.items() if p > position)
            changes = [Change(p, key[0], key[1], indexes.record(*key)) for p, key in newer]
            return ChangeBatch(self._position, changes)

    def status(self) -> StoreStatus:
        return StoreStatus(self.backend, self.location, True, self._position)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()

    # -- internals --------------------------------------------------------------------------------
    def _root(self) -> Path:
        if self.directory is None:
            raise ValueError("this store has no directory")
        return self.directory

    def _reload(self) -> None:
        """Make the indexes hold exactly the directory's live version."""
        indexes = self._attached()
        version = self._version()
        with indexes.lock:
            parts = read_index(version, self._config) if version is not None else {}
            indexes.replace(parts)
            self._seen = version.name if version is not None else None
            if version is not None:
                self._remember(version, {n: f.name for n, f in collection_folders(version).items()})

    def _version(self) -> Path | None:
        if self.directory is None:
            return None
        try:
            return current_version(self.directory)
        except FileNotFoundError:
            return None

    def _attached(self) -> SearchIndexes:
        if self._indexes is None:
            raise RuntimeError("attach the store to its indexes first")
        return self._indexes

    def _next(self) -> int:
        self._position += 1
        return self._position

    def _logged(self, key: tuple[str, str], position: int) -> None:
        self._log.pop(key, None)
        self._log[key] = position

    def _undo(self, previous: Sequence[tuple[tuple[str, str], DocumentWrite | None]]) -> None:
        """Put documents back as they were before a write that could not be saved."""
        indexes = self._attached()
        for (collection, doc_id), state in reversed(previous):
            if state is None:
                indexes.apply_delete(collection, doc_id, self._next())
            else:
                indexes.apply(state, self._next())

    def _claim_directory(self) -> None:
        if self.directory is not None:
            self.claim()  # before any work: a refused write changes nothing

    def _persist(self) -> Path | None:
        if self.directory is None:
            return None
        return self._save_to(self.directory)

    def _save_to(self, root: Path) -> Path:
        folders: dict[str, str] = {}
        version = save_version(root, lambda tmp: folders.update(self._write_version(tmp, root)))
        self._remember(version, folders)
        return version

    def _write_version(self, directory: Path, root: Path) -> dict[str, str]:
        """Write a version into ``directory``; link the files of collections unchanged since the
        version now live under ``root``. Returns each collection's folder name."""
        try:
            live = collection_folders(current_version(root))
        except FileNotFoundError:
            live = {}
        collections = self._attached().collections
        unchanged = {
            name: folder
            for name, folder in live.items()
            if name in collections and self._saved.get(name) == (folder, collections[name].changes)
        }
        return write_index(directory, self._config, list(collections.values()), unchanged)

    def _remember(self, version: Path, folders: dict[str, str]) -> None:
        """Record which folder of ``version`` holds each collection as it is now."""
        if self.directory is not None and _same(version.parent, self.directory):
            self._seen = version.name
        collections = self._attached().collections
        self._saved = {
            name: (version / folder, collections[name].changes)
            for name, folder in folders.items()
            if name in collections
        }


def _changed(indexes: SearchIndexes, write: DocumentWrite) -> bool:
    coll = indexes.get(write.collection)
    return coll is None or coll.needs_update(write.document.id, write.digest)


def _same(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def export_index(indexes: SearchIndexes, directory: Path, config: RAGConfig) -> Path:
    """Write what ``indexes`` hold as a new version of the local index directory ``directory``
    (holding its writer lock meanwhile); return the version."""
    with indexes.lock, DirectoryLock(directory):
        collections = list(indexes.collections.values())

        def write(tmp: Path) -> None:
            write_index(tmp, config, collections)

        return save_version(directory, write)
