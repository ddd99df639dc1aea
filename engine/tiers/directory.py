"""The disk tier's folder: one file per KV block, named by its address, within a byte budget.

The folder is the index. A block exists exactly when its file does, so a restarted engine, and every
replica that shares the folder, sees every block without a journal; a scan at start (and every few
seconds while writing, since other processes write too) rebuilds only the byte count and the LRU order.
Least recently used means oldest modification time: reads and re-inserts touch a block's file, and the
blocks of one prefix get times a microsecond apart, deepest oldest, so a prefix loses its tail first
(a block is useless without the blocks before it).

Example:
    >>> folder = BlockDirectory(Path("/tmp/kv"), capacity_bytes=1 << 30)   # doctest: +SKIP
    >>> folder.path("ab12...")                                              # doctest: +SKIP
    PosixPath('/tmp/kv/ab/ab12....kvb')
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path

from engine.tiers.blockfile import TEMP_PREFIX

log = logging.getLogger(__name__)

SUFFIX = ".kvb"
RESCAN_S = 10.0  # while writing, recount at least this often (other processes write to the folder too)
STALE_TEMP_S = 3600.0  # a temp file this old is a crashed writer's, whatever its pid says
DEPTH_NS = 1000  # mtime step between a block and its parent


class BlockDirectory:
    """Block files under ``root/<2 hex>/<address>.kvb`` within ``capacity_bytes`` (see the module)."""

    def __init__(self, root: Path, capacity_bytes: int) -> None:
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self.evictions = 0
        self.evicted_bytes = 0
        self._lock = threading.Lock()
        self._used = 0
        self._scanned_at = 0.0
        self.rescan()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}{SUFFIX}"

    def exists(self, key: str) -> bool:
        return os.path.exists(self.path(key))

    def size_of(self, key: str) -> int:
        """A block file's size in bytes (0 if there is none)."""
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            return 0

    @property
    def used_bytes(self) -> int:
        """Bytes of block files, as of the last scan plus this process's writes and deletions since."""
        return self._used

    def touch(self, key: str, depth: int, now_ns: int) -> bool:
        """Mark a block used now (``depth``: its index in its prefix); False if it is gone."""
        try:
            os.utime(self.path(key), ns=(now_ns, now_ns - depth * DEPTH_NS))
            return True
        except FileNotFoundError:
            return False

    def remove(self, key: str) -> None:
        """Delete a block's file (a damaged or foreign one); gone already is fine."""
        path = self.path(key)
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            with self._lock:
                self._used -= size

    def added(self, nbytes: int) -> None:
        """Count the bytes a block file this process just wrote added (its size less any it replaced)."""
        with self._lock:
            self._used += nbytes

    def reserve(self, nbytes: int, keep: Collection[str] = ()) -> bool:
        """Make room for ``nbytes`` more, evicting least recently used blocks other than ``keep``; False
        when that cannot be done (the budget is smaller, or held by ``keep``)."""
        if nbytes > self.capacity_bytes:
            return False
        stale = time.monotonic() - self._scanned_at > RESCAN_S
        if self._used + nbytes <= self.capacity_bytes and not stale:
            return True
        files = self.rescan()
        if self._used + nbytes <= self.capacity_bytes:
            return True
        # evict to leave some headroom, so a full folder is not rescanned on every write
        target = self.capacity_bytes - max(nbytes, self.capacity_bytes // 20)
        for _, size, path in sorted(files):
            if self._used <= target:
                break
            if path.stem in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                with self._lock:
                    self._used -= size
                    self.evictions += 1
                    self.evicted_bytes += size
        return self._used + nbytes <= self.capacity_bytes

    def rescan(self) -> list[tuple[int, int, Path]]:
        """(mtime_ns, size, path) of every block file; recounts the bytes used and deletes crashed
        writers' temp files."""
        files = []
        for entry in self._entries():
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            if entry.name.startswith(TEMP_PREFIX):
                _remove_if_stale(Path(entry.path), st.st_mtime)
            elif entry.name.endswith(SUFFIX):
                files.append((st.st_mtime_ns, st.st_size, Path(entry.path)))
        with self._lock:
            self._used = sum(size for _, size, _ in files)
            self._scanned_at = time.monotonic()
        return files

    def _entries(self) -> Iterator[os.DirEntry[str]]:
        subdirs: list[str] = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root) as top:
            subdirs = [e.path for e in top if e.is_dir(follow_symlinks=False) and len(e.name) == 2]
        for sub in subdirs:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(sub) as it:
                yield from it


def _remove_if_stale(path: Path, mtime: float) -> None:
    """Delete a temp file whose writer is gone (its pid is in the name) or that is very old."""
    try:
        pid = int(path.name[len(TEMP_PREFIX) :].split("-", 1)[0])
    except ValueError:
        pid = -1
    alive = pid > 0 and _pid_alive(pid)
    if not alive or time.time() - mtime > STALE_TEMP_S:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            log.info("removed a crashed writer's temp file %s", path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
