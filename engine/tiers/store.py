"""Where a block tier keeps its records: the `BlockStore` protocol (a folder, a Redis server).

A store holds opaque records (engine.tiers.blockformat) under hex addresses; the tier policy
(engine.tiers.block_tier) decides what to read and write, the store only moves bytes. A store that cannot be reached right now raises
`StoreUnavailable` (a miss for the reader, a dropped write for the writer, never an error for a
request); a write it refuses (a full disk, Redis out of memory) raises `StoreWriteError`.

Example:
    >>> store.exists([key])                     # doctest: +SKIP
    [True]
    >>> data = store.read(key, scratch)         # the record's bytes, or None if missing  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

import numpy as np


class StoreUnavailable(Exception):
    """The store cannot be reached now (down, slow, restarting): the call did nothing."""


class StoreWriteError(Exception):
    """The store refused a write (no space, out of memory): the record was not written."""


class BlockStore(Protocol):
    """Records by address. Every method may raise `StoreUnavailable`."""

    def exists(self, addresses: Sequence[str]) -> list[bool]:
        """Whether each record is there (no side effects)."""
        ...

    def read(self, address: str, scratch: np.ndarray) -> np.ndarray | None:
        """The record's bytes (a writable uint8 array, in ``scratch`` when it fits); None if missing."""
        ...

    def head(self, address: str, nbytes: int) -> bytes | None:
        """The record's first ``nbytes`` (its header); None if missing."""
        ...

    def write(
        self,
        address: str,
        parts: Sequence[bytes | memoryview],
        *,
        durable: bool,
        depth: int,
        keep: Collection[str],
    ) -> int | None:
        """Store a record atomically (replacing one at the same address; ``depth``: its block's index in
        its prefix); its size, or None when the budget has no room for it without evicting ``keep``.
        `StoreWriteError` if refused; ``durable`` False: a hint that may be lost in a crash."""
        ...

    def touch(self, addresses: Sequence[tuple[str, int]]) -> list[bool]:
        """Mark records (with their depth in their prefix) used now; False for each one that is gone."""
        ...

    def used(self, addresses: Sequence[tuple[str, int]]) -> None:
        """The reader just read these records: keep them recent (a no-op where reads already do)."""
        ...

    def remove(self, address: str) -> None:
        """Delete a record (a damaged or foreign one); gone already is fine."""
        ...

    def describe(self, address: str) -> str:
        """Where a record lives, for log lines (a path, a Redis key)."""
        ...

    def stats(self) -> dict[str, Any]:
        """``engine.tiers.stats.STORE_STATS`` and where the store is; never blocks on the network."""
        ...

    def close(self) -> None: ...
