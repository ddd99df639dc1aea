"""Measurements of this machine's kernels kept on disk: row-tile menus and exact-reuse verdicts.

Both are facts about the CPU and the libraries, not about a run, so a process that starts on the same
machine with the same software reads them back instead of measuring again (a server's start, each
replica's). An entry is keyed by the machine's signature (CPU model and flags, torch's version and
build, the thread count and the ISA-narrowing environment) and by what was measured; it lives in its
own JSON file under ``$PREFIXRAG_HOME/calibration/``, written atomically. A missing, unreadable or
malformed entry is measured again, never trusted.

Example:
    >>> remember("demo", ("key",), {"sizes": [16]}) and recall("demo", ("key",))   # doctest: +SKIP
    {'sizes': [16]}
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from engine.isa import cpu_flags, cpu_model, path_key
from engine.paths import prefixrag_home

log = logging.getLogger(__name__)
_DISABLE = "PREFIXRAG_NO_CALIBRATION_CACHE"  # set (to anything) to always measure afresh


@functools.cache
def machine_signature() -> str:
    """The CPU (model, flags) and torch (version, build) that decide which kernels run."""
    return json.dumps([cpu_model(), sorted(cpu_flags()), torch.__version__, torch.__config__.show()])


def _path(kind: str, key: tuple[object, ...]) -> Path:
    digest = hashlib.sha256(json.dumps([machine_signature(), path_key(), kind, key], default=str).encode())
    return prefixrag_home() / "calibration" / f"{kind}-{digest.hexdigest()[:32]}.json"


def recall(kind: str, key: tuple[object, ...]) -> dict[str, Any] | None:
    """The stored value for ``(kind, key)`` on this machine, or None."""
    if os.environ.get(_DISABLE):
        return None
    try:
        value = json.loads(_path(kind, key).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def remember(kind: str, key: tuple[object, ...], value: dict[str, Any]) -> None:
    """Store ``value`` for ``(kind, key)`` (best effort: a read-only home only costs a re-measure)."""
    if os.environ.get(_DISABLE):
        return
    path = _path(kind, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("calibration not stored at %s: %s", path, exc)
