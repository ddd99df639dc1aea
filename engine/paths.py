"""Where prefixrag keeps its files: ``$PREFIXRAG_HOME`` (default ``~/.cache/prefixrag``).

Example:
    >>> import os; os.environ["PREFIXRAG_HOME"] = "/tmp/prh"
    >>> str(prefixrag_home())
    '/tmp/prh'
"""

from __future__ import annotations

import os
from pathlib import Path


def prefixrag_home() -> Path:
    """Where converted models, indexes, KV files and benchmark output live (``$PREFIXRAG_HOME``)."""
    return Path(os.environ.get("PREFIXRAG_HOME", Path.home() / ".cache" / "prefixrag")).expanduser()


def kv_cache_dir() -> Path:
    """The disk KV tier's folder for `prefixrag serve` and `prefixrag cache warm`: ``$PREFIXRAG_HOME/kv``."""
    return prefixrag_home() / "kv"
