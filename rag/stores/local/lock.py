"""One writer per local index directory: an OS lock (``flock``) on ``<dir>/LOCK``.

Each writer keeps its documents in memory and saves them whole, so two writers on one directory
would lose each other's writes. The lock makes the second one fail at once, with an error naming the
way to run several replicas (a shared ``--document-store``). The kernel drops the lock when the
holder exits, however it exits, so a killed writer never leaves a stale lock behind. Readers take no
lock (they read the complete version ``CURRENT`` names).

Example:
    >>> lock = DirectoryLock(Path("my-index")).acquire()    # doctest: +SKIP
    >>> DirectoryLock(Path("my-index")).acquire()           # doctest: +SKIP
    Traceback (most recent call last):
    rag.stores.protocol.StoreLocked: my-index is open for writing by another writer (pid 4242): ...
    >>> lock.release()                                      # doctest: +SKIP
"""

from __future__ import annotations

import fcntl
import os
import weakref
from pathlib import Path

from rag.stores.protocol import StoreLocked

LOCK_FILE = "LOCK"
STORE_HINT = (
    "a local index directory has a single writer: stop the other one, or run every writer on one "
    "shared store with --document-store postgresql://... (PREFIXRAG_DOCUMENT_STORE)"
)


class DirectoryLock:
    """An exclusive, non-blocking lock on a directory, held until ``release`` or process exit.

    Example:
        >>> with DirectoryLock(Path("my-index")):       # doctest: +SKIP
        ...     write_the_index()
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._closer: weakref.finalize | None = None  # a lock dropped unreleased closes its file

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> DirectoryLock:
        """Take the lock (creating the directory if needed); StoreLocked if another holder has it."""
        if self._fd is not None:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            who = "this process" if holder == str(os.getpid()) else f"pid {holder}" if holder else "unknown"
            raise StoreLocked(
                f"{self.directory} is open for writing by another writer ({who}): {STORE_HINT}"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        self._closer = weakref.finalize(self, os.close, fd)
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        if self._closer is not None:
            self._closer.detach()
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
