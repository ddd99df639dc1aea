"""Cache-owned KV blocks carved from large slabs, and recycled when the cache lets them go.

The prefix cache keeps what it stores as 64-token blocks (``KVSegment.copy``). Blocks allocated one by
one would land in the worker thread's malloc arena between the prefill's temporaries; the arena
fragments and the next prefill pays for it in page faults. Blocks from a few long-lived slabs keep the
cache's memory out of that arena (docs/benchmarks/report.md has the measured effect).

A slot returns to its slab when the last block or view that uses it is gone (``Slot.__del__``), so a
match still being loaded, or a split's view, can never see its memory reused. Slabs are made on demand
and dropped when empty while another slab's worth of slots is free, so the memory held never exceeds
what the cache held at its peak plus one slab.

Example:
    >>> pool = KVBlockPool(block_tokens=4, slab_bytes=1 << 20)
    >>> keys = values = torch.ones(2, 1, 4, 8)              # [layers, kv_heads, block_tokens, head_dim]
    >>> slot = pool.take(keys, values)
    >>> _ = slot.keys.copy_(keys); pool.stats()["used_blocks"]
    1
    >>> del slot
    >>> pool.stats()["used_blocks"]
    0
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Sequence
from typing import Any

import torch


class Slot:
    """One block's keys and values inside a slab; back to the pool when nothing refers to it."""

    __slots__ = ("_slab", "index", "keys", "values")

    def __init__(self, slab: _Slab, index: int) -> None:
        self._slab = slab
        self.index = index
        self.keys = slab.keys[index]
        self.values = slab.values[index]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to give back to
            self._slab.pool._give_back(self._slab, self.index)


class _Slab:
    __slots__ = ("free", "keys", "pool", "size", "values")

    def __init__(
        self,
        pool: KVBlockPool,
        size: int,
        k_shape: tuple[int, ...],
        v_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.pool = pool
        self.size = size
        self.keys = torch.empty(size, *k_shape, dtype=dtype, device=device)
        self.values = torch.empty(size, *v_shape, dtype=dtype, device=device)
        self.free = list(range(size - 1, -1, -1))  # pop() hands out index 0 first

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


class KVBlockPool:
    """Fixed-size KV blocks (``[layers, kv_heads, block_tokens, head_dim]`` keys and values) in slabs of
    about ``slab_bytes``. One block shape per pool (the first one taken): ``take`` answers None for any
    other, and the caller allocates that block on its own."""

    def __init__(self, block_tokens: int, slab_bytes: int = 64 << 20) -> None:
        if block_tokens < 1 or slab_bytes < 1:
            raise ValueError(f"block_tokens and slab_bytes must be >= 1, got {block_tokens}, {slab_bytes}")
        self.block_tokens = block_tokens
        self.slab_bytes = slab_bytes
        self._kind: tuple[Any, ...] | None = None
        self._slabs: list[_Slab] = []  # oldest first: blocks come from the oldest slab with room
        self._used = 0
        self._lock = threading.RLock()  # a Slot may die (and give back) inside take() on this thread

    def take(self, keys: torch.Tensor, values: torch.Tensor) -> Slot | None:
        """An unused slot shaped like ``keys``/``values`` (its contents are stale: copy into it), or
        None if they are not a whole block of this pool's kind."""
        if keys.dtype != values.dtype:
            return None
        return self.take_shaped(keys.shape, values.shape, keys.dtype, keys.device)

    def take_shaped(
        self, k_shape: Sequence[int], v_shape: Sequence[int], dtype: torch.dtype, device: Any
    ) -> Slot | None:
        """``take`` by shape and dtype (a block encoded into the slot need not exist as a tensor yet)."""
        if len(k_shape) != 4 or k_shape[2] != self.block_tokens or v_shape[2] != self.block_tokens:
            return None
        kind = (tuple(k_shape), tuple(v_shape), dtype, torch.device(device))
        with self._lock:
            if self._kind is None:
                self._kind = kind
            elif kind != self._kind:
                return None
            slab = next((s for s in self._slabs if s.free), None)
            if slab is None:
                size = torch.empty(0, dtype=dtype).element_size()
                block_bytes = (math.prod(k_shape) + math.prod(v_shape)) * size
                count = max(1, self.slab_bytes // block_bytes)
                slab = _Slab(self, count, tuple(k_shape), tuple(v_shape), dtype, torch.device(device))
                self._slabs.append(slab)
            index = slab.free.pop()
            self._used += 1
        return Slot(slab, index)

    def _give_back(self, slab: _Slab, index: int) -> None:
        with self._lock:
            slab.free.append(index)
            self._used -= 1
            if len(slab.free) == slab.size and slab in self._slabs:
                spare = sum(len(s.free) for s in self._slabs) - slab.size
                if spare >= slab.size:  # another slab's worth is free elsewhere: let this one go
                    self._slabs.remove(slab)

    def stats(self) -> dict[str, int]:
        """Slabs held, their bytes, and the blocks in use."""
        with self._lock:
            return {
                "slabs": len(self._slabs),
                "slab_bytes": sum(s.nbytes for s in self._slabs),
                "used_blocks": self._used,
                "free_blocks": sum(len(s.free) for s in self._slabs),
            }
