"""Crash-safe saving of a directory of files: versioned subdirectories and an atomic pointer.

Layout under ``root``::

    CURRENT          one line: the name of the live version, e.g. ``v000003``
    v000003/         the files of that version, complete and fsynced before CURRENT names it

``save_version`` writes a new version into a temporary directory, fsyncs every file and the
directory, renames it into place, then switches ``CURRENT`` with ``os.replace`` (atomic on POSIX) and
only then removes older versions. A crash at any point leaves ``CURRENT`` naming a complete version.

Example:
    >>> save_version(root, lambda d: (d / "data.json").write_text("{}"))   # doctest: +SKIP
    >>> current_version(root)                                            # doctest: +SKIP
    PosixPath('root/v000001')
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

POINTER = "CURRENT"
_VERSION = re.compile(r"^v(\d{6,})$")


def current_version(root: str | os.PathLike[str]) -> Path:
    """The live version directory under ``root``; FileNotFoundError naming root if there is none."""
    root = Path(root)
    pointer = root / POINTER
    if not pointer.is_file():
        raise FileNotFoundError(f"no saved index at {str(root)!r} (missing {POINTER} file)")
    name = pointer.read_text(encoding="utf-8").strip()
    if not _VERSION.match(name) or not (root / name).is_dir():
        raise FileNotFoundError(f"{pointer} names {name!r}, which is not a version directory")
    return root / name


def save_version(root: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_dir)``, make the result durable, publish it as the new version; return its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write(tmp)
        fsync_tree(tmp)
        final = root / f"v{_next_number(root):06d}"
        os.rename(tmp, final)
        fsync_dir(root)
        _switch_pointer(root, final.name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _remove_stale(root, keep=final.name)
    return final


def _next_number(root: Path) -> int:
    numbers = [int(m.group(1)) for p in root.iterdir() if (m := _VERSION.match(p.name))]
    return max(numbers, default=0) + 1


def _switch_pointer(root: Path, name: str) -> None:
    tmp = root / f".{POINTER}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / POINTER)
    fsync_dir(root)


def _remove_stale(root: Path, keep: str) -> None:
    """Delete old versions and leftovers of interrupted saves (never the live version)."""
    for path in root.iterdir():
        if (
            path.name != keep
            and path.is_dir()
            and (_VERSION.match(path.name) or path.name.startswith(".tmp-"))
        ):
            shutil.rmtree(path, ignore_errors=True)


def fsync_tree(directory: Path) -> None:
    """fsync every file under ``directory`` and the directories themselves."""
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
