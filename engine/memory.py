"""Handing freed heap memory back to the operating system.

glibc's malloc keeps memory that requests freed (per-request KV buffers, activations, tokenizer and
JSON scratch from many threads) in its arenas rather than returning it, so a server's resident size
ratchets up under load and stays there, which looks like a leak to anyone watching RSS (and to a
container's memory limit). ``trim_heap`` asks glibc to return what is free; the engine calls it when
it has been idle for `EngineConfig.idle_trim_s` after serving. Elsewhere (musl, macOS) it does nothing.

Example:
    >>> trim_heap() in (True, False)
    True
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Return free heap memory to the OS (a few ms); True if some was released."""
    return bool(_TRIM(0)) if _TRIM is not None else False
