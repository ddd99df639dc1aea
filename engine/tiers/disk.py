"""The disk tier: KV blocks in a folder that survives restarts and that the replicas of one model may
share; a `BlockTier` (the policy, engine.tiers.block_tier) over `DiskStore` (one file per record,
engine.tiers.blockfile, in an LRU-bounded folder, engine.tiers.directory).

Example:
    >>> tier = DiskTier(Path("/srv/kv"), 8 << 30, fingerprint=fp, codec=codec,           # doctest: +SKIP
    ...                 kv_dtype="float32", geometry=KVGeometry(30, 3, 64), cache=engine.cache)
    >>> added = tier.extend(buffer, prompt_ids, namespace, limit=len(prompt_ids) - 1)   # doctest: +SKIP
    >>> tier.persist(namespace, prompt_ids)                                              # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.kv.codec import KVCodec, KVGeometry
from engine.tiers.block_tier import BlockTier
from engine.tiers.blockfile import read_head, read_record, write_record
from engine.tiers.directory import BlockDirectory
from engine.tiers.store import StoreWriteError
from prefix_cache import RadixCache

log = logging.getLogger(__name__)


class DiskStore:
    """`BlockStore` over a `BlockDirectory`: a record is a file named by its address."""

    def __init__(self, folder: BlockDirectory) -> None:
        self.folder = folder

    def exists(self, addresses: Sequence[str]) -> list[bool]:
        return [self.folder.exists(key) for key in addresses]

    def read(self, address: str, scratch: np.ndarray) -> np.ndarray | None:
        try:
            return read_record(self.folder.path(address), scratch)
        except FileNotFoundError:
            return None

    def head(self, address: str, nbytes: int) -> bytes | None:
        try:
            return read_head(self.folder.path(address), nbytes)
        except FileNotFoundError:
            return None

    def write(
        self,
        address: str,
        parts: Sequence[bytes | memoryview],
        *,
        durable: bool,
        depth: int,
        keep: Collection[str],
    ) -> int | None:
        if not self.folder.reserve(sum(len(p) for p in parts), keep=keep):
            return None
        path = self.folder.path(address)
        replaced = self.folder.size_of(address)  # a partial block is rewritten longer
        try:
            size = write_record(path, parts, durable=durable)
        except OSError as exc:  # a full or read-only disk
            raise StoreWriteError(str(exc)) from None
        self.folder.added(size - replaced)
        self.folder.touch(address, depth, time.time_ns())
        return size

    def touch(self, addresses: Sequence[tuple[str, int]]) -> list[bool]:
        now = time.time_ns()
        return [self.folder.touch(key, depth, now) for key, depth in addresses]

    def used(self, addresses: Sequence[tuple[str, int]]) -> None:
        self.touch(addresses)  # least recently used is oldest modification time

    def remove(self, address: str) -> None:
        self.folder.remove(address)

    def describe(self, address: str) -> str:
        return str(self.folder.path(address))

    def stats(self) -> dict[str, Any]:
        f = self.folder
        return {
            "directory": str(f.root),
            "capacity_bytes": f.capacity_bytes,
            "used_bytes": f.used_bytes,
            "evictions": f.evictions,
            "evicted_bytes": f.evicted_bytes,
            "available": 1,
            "outages": 0,  # a folder that fails is a write error or a rejected read, not an outage
        }

    def close(self) -> None:
        """Nothing to release: every record is a closed file."""


class DiskTier(BlockTier):
    """Disk KV blocks under ``directory`` within ``capacity_bytes`` (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        capacity_bytes: int,
        *,
        fingerprint: str,
        codec: KVCodec,
        kv_dtype: str,
        geometry: KVGeometry,
        cache: RadixCache,
        queue_size: int = 256,
        read_threads: int = 4,
    ) -> None:
        self.folder = BlockDirectory(directory, capacity_bytes)
        super().__init__(
            DiskStore(self.folder),
            name="disk",
            fingerprint=fingerprint,
            codec=codec,
            kv_dtype=kv_dtype,
            geometry=geometry,
            cache=cache,
            log=log,
            queue_size=queue_size,
            read_threads=read_threads,
        )


def open_disk_tier(engine: Any, fingerprint: str) -> DiskTier | None:
    """The disk tier ``engine.config`` asks for (None when it asks for none, or the folder cannot be
    used: logged, and the engine serves without it)."""
    cfg = engine.config
    if cfg.disk_cache_dir is None or cfg.disk_cache_bytes == 0:
        return None
    try:
        return DiskTier(
            cfg.disk_cache_dir,
            cfg.disk_cache_bytes,
            fingerprint=fingerprint,
            codec=engine.kv_codec,
            kv_dtype=cfg.kv_dtype,
            geometry=engine.kv_geometry,
            cache=engine.cache,
        )
    except OSError as exc:
        log.warning("disk KV tier off: cannot use %s (%s)", cfg.disk_cache_dir, exc)
        return None
