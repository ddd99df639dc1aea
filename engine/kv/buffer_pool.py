"""Recycling the KV storage of finished requests.

A request's ``KVBuffer`` is one preallocated tensor pair. Allocated fresh, every page of it faults in
on first touch, which makes loading a cached prefix several times slower than into recycled storage.
The pool keeps the storage of finished requests, up to a byte budget, and hands it to the next request
that fits. The prefix cache never holds views into a buffer (it copies what it keeps), so a finished
request's storage is free to reuse.

Example:
    >>> pool = BufferPool(max_bytes=1 << 30)
    >>> buf = pool.take(lambda capacity: KVBuffer(num_layers=2, capacity=capacity), 16)
    >>> buf.ensure_storage(heads=1, head_dim=4, dtype=torch.float32)
    >>> pool.give(buf)
    >>> pool.take(lambda capacity: KVBuffer(num_layers=2, capacity=capacity), 8).capacity  # recycled
    16
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from engine.kv.state import KVBuffer

NewBuffer = Callable[[int], KVBuffer]


class BufferPool:
    """Finished requests' KV storage, kept up to ``max_bytes`` (0: never keep any)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._free: list[tuple[torch.Tensor, torch.Tensor]] = []  # oldest first
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held for reuse."""
        with self._lock:
            return sum(_nbytes(k, v) for k, v in self._free)

    def take(self, new_buffer: NewBuffer, capacity: int) -> KVBuffer:
        """An empty buffer for ``capacity`` tokens: on the smallest kept storage that fits, else new."""
        with self._lock:
            fits = [i for i, (k, _) in enumerate(self._free) if k.shape[3] >= capacity]
            best = min(fits, key=lambda i: self._free[i][0].shape[3], default=None)
            storage = self._free.pop(best) if best is not None else None
        if storage is None:
            return new_buffer(capacity)
        keys, values = storage
        buffer = new_buffer(int(keys.shape[3]))
        buffer.adopt_storage(keys, values)
        return buffer

    def give(self, buffer: KVBuffer) -> None:
        """Keep ``buffer``'s storage for a later request (dropping the oldest kept ones over budget).
        The caller must not use ``buffer`` afterwards."""
        keys, values = buffer.k_store, buffer.v_store
        buffer.k_store = buffer.v_store = None
        if keys is None or values is None or _nbytes(keys, values) > self.max_bytes:
            return
        with self._lock:
            self._free.append((keys, values))
            while sum(_nbytes(k, v) for k, v in self._free) > self.max_bytes:
                self._free.pop(0)

    def clear(self) -> None:
        """Let go of everything kept."""
        with self._lock:
            self._free.clear()


def _nbytes(keys: torch.Tensor, values: torch.Tensor) -> int:
    return keys.numel() * keys.element_size() + values.numel() * values.element_size()
