"""Recycling the KV storage of finished requests, and the KV it still holds.

A request's ``KVBuffer`` is one preallocated tensor pair. Allocated fresh, every page of it faults in
on first touch, which makes loading a cached prefix several times slower than into recycled storage.
The pool keeps the storage of finished requests, up to a byte budget, and hands it to the next request
that fits. The prefix cache never holds views into a buffer (it copies what it keeps), so a finished
request's storage is free to reuse.

A finished request's storage still holds the KV of its tokens, the bits the cache keeps for them: the
cache copied them from there, or they were loaded from the cache (or, where a concurrent request
inserted the same tokens first, they were computed on the same kernels). Given with ``held`` (the
namespace and token ids whose KV it holds, from position 0), the pool hands that storage to a later
request of the same namespace whose prompt starts with some of those tokens, already that long: the
request then copies from the cache only the rest of its match. A repeated prompt, a question changed at
its end, or a chat's next turn skips copying its prefix, a copy at memory speed.

Example:
    >>> pool = BufferPool(max_bytes=1 << 30)
    >>> buf = pool.take(lambda capacity: KVBuffer(num_layers=2, capacity=capacity), 16)
    >>> buf.ensure_storage(heads=1, head_dim=4, dtype=torch.float32)
    >>> buf.set_length(3)
    >>> pool.give(buf, Held("tenant", (5, 6, 7)))
    >>> again = pool.take(lambda capacity: KVBuffer(num_layers=2, capacity=capacity), 8, Want("tenant", [5, 6, 9], 3))
    >>> again.capacity, again.length  # recycled, holding the KV of tokens 5 and 6
    (16, 2)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.kv.state import KVBuffer

NewBuffer = Callable[[int], KVBuffer]


@dataclass(frozen=True)
class Held:
    """What a given buffer's storage holds: the KV of ``tokens`` (from position 0) in ``namespace``."""

    namespace: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Want:
    """What a request may take held KV for: at most ``limit`` leading tokens of ``tokens``, the part of
    its prompt the cache matched in ``namespace``."""

    namespace: str
    tokens: Sequence[int]
    limit: int


@dataclass
class _Kept:
    keys: torch.Tensor
    values: torch.Tensor
    held: Held | None

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys, self.values)


class BufferPool:
    """Finished requests' KV storage, kept up to ``max_bytes`` (0: never keep any)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._free: list[_Kept] = []  # oldest first
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held for reuse."""
        with self._lock:
            return sum(k.nbytes for k in self._free)

    def take(self, new_buffer: NewBuffer, capacity: int, want: Want | None = None) -> KVBuffer:
        """A buffer for at least ``capacity`` tokens. With ``want``: on the kept storage holding the
        longest run of its leading tokens (then the buffer's ``length``), else on the smallest kept
        storage that fits (empty), else new."""
        with self._lock:
            best, held = self._holding(want) if want is not None else (None, 0)
            if best is None:
                fits = [i for i, k in enumerate(self._free) if k.keys.shape[3] >= capacity]
                best = min(fits, key=lambda i: self._free[i].keys.shape[3], default=None)
            kept = self._free.pop(best) if best is not None else None
        if kept is None:
            return new_buffer(capacity)
        buffer = new_buffer(int(kept.keys.shape[3]))
        buffer.adopt_storage(kept.keys, kept.values)
        if held:
            buffer.set_length(held)
        buffer.reserve(capacity)
        return buffer

    def _holding(self, want: Want) -> tuple[int | None, int]:
        """The kept storage holding the most of ``want``'s leading tokens, and how many (newest first)."""
        best, most = None, 0
        for i in range(len(self._free) - 1, -1, -1):
            held = self._free[i].held
            if held is None or held.namespace != want.namespace:
                continue
            n = common_prefix(held.tokens, want.tokens, min(want.limit, len(held.tokens)))
            if n > most:
                best, most = i, n
        return best, most

    def give(self, buffer: KVBuffer, held: Held | None = None) -> None:
        """Keep ``buffer``'s storage for a later request (dropping the oldest kept ones over budget);
        ``held``: the KV it holds, which ``take`` may hand on. The caller must not use ``buffer``
        afterwards."""
        if held is not None and len(held.tokens) > buffer.length:
            raise ValueError(f"a buffer of {buffer.length} tokens cannot hold {len(held.tokens)}")
        keys, values = buffer.k_store, buffer.v_store
        buffer.k_store = buffer.v_store = None
        if keys is None or values is None or _nbytes(keys, values) > self.max_bytes:
            return
        with self._lock:
            self._free.append(_Kept(keys, values, held))
            while sum(k.nbytes for k in self._free) > self.max_bytes:
                self._free.pop(0)

    def clear(self) -> None:
        """Let go of everything kept."""
        with self._lock:
            self._free.clear()


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading elements ``a`` and ``b`` share, at most ``limit`` (slices compared in C)."""
    lo, hi = 0, max(0, min(limit, len(a), len(b)))
    while lo < hi:  # a[:lo] == b[:lo] holds throughout
        mid = (lo + hi + 1) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _nbytes(keys: torch.Tensor, values: torch.Tensor) -> int:
    return keys.numel() * keys.element_size() + values.numel() * values.element_size()
