"""The write path of a block tier (engine.tiers.block_tier), run by its writer thread: for a prefix
just inserted into RAM, the whole blocks the store lacks (each with a link at its first token, which
a prompt diverging inside the block finds), then the partial block after them, unless the record
there already holds it. The KV comes from the RAM cache at write time; a prefix RAM no longer holds is
skipped (its next insert queues it again).

Example:
    >>> writes = BlockWrites(store, PrefixAddresses(fp, "float32"), codec=codec, cache=cache,  # doctest: +SKIP
    ...                      counters=TierCounters(), name="disk", log=log)
    >>> writes.write_prefix("m\\x1ftenant", prompt_ids)                                       # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from engine.kv.codec import KVCodec
from engine.kv.state import BLOCK_TOKENS, KVSegment
from engine.tiers.addresses import PrefixAddresses, block_hashes, tail_hash
from engine.tiers.blockformat import HEAD_BYTES, BlockMeta, encode_block, encode_link, record_tokens
from engine.tiers.stats import TierCounters
from engine.tiers.store import BlockStore, StoreUnavailable, StoreWriteError
from prefix_cache import RadixCache


class BlockWrites:
    """Writes a prefix's missing records into ``store`` (see the module docstring)."""

    def __init__(
        self,
        store: BlockStore,
        addresses: PrefixAddresses,
        *,
        codec: KVCodec,
        cache: RadixCache,
        counters: TierCounters,
        name: str,
        log: logging.Logger,
    ) -> None:
        self.store = store
        self.addresses = addresses
        self.codec = codec
        self.cache = cache
        self.counters = counters
        self.name = name
        self.log = log

    def write_prefix(self, namespace: str, tokens: list[int]) -> None:
        """Write what the store lacks of ``tokens`` (the writer thread's one job)."""
        try:
            self._write_missing(namespace, tokens)
        except StoreUnavailable:
            self.counters.add(unavailable=1, write_dropped=1)

    def _write_missing(self, namespace: str, tokens: list[int]) -> None:
        b = BLOCK_TOKENS
        chain = block_hashes(self.addresses.root(namespace), tokens)
        whole = len(chain) * b
        missing = [
            j for j, there in enumerate(self.store.touch([(k, j) for j, k in enumerate(chain)])) if not there
        ]
        tail = (
            tail_hash(self.addresses.parent(chain, namespace, whole), tokens[whole])
            if whole < len(tokens)
            else None
        )
        covered = tail is None or self._covers(tail, tokens[whole:], len(chain))
        if not missing and covered:
            return
        length, values = self.cache.peek_values(tokens, namespace)
        if not values:
            return
        kv = KVSegment.concat(values)
        for j in missing:
            if (j + 1) * b > length:
                return  # the RAM cache no longer (or never) held the rest
            if not self._write_block(
                kv[j * b : (j + 1) * b], chain, namespace, j, tokens[j * b : (j + 1) * b]
            ):
                return
        if tail is not None and not covered and length > whole:
            meta = self.addresses.meta(chain, namespace, whole, tail, tokens[whole:length])
            self._put(tail, self._encode(kv[whole:length], meta), chain, len(chain), durable=True)

    def _write_block(
        self, part: KVSegment, chain: list[str], namespace: str, j: int, block: list[int]
    ) -> bool:
        """Write whole block ``j``, then the link to it at its first token; False if the block was not."""
        meta = self.addresses.meta(chain, namespace, j * BLOCK_TOKENS, chain[j], block)
        if not self._put(chain[j], self._encode(part, meta), chain, j, durable=True):
            return False
        link = BlockMeta(
            tail_hash(bytes.fromhex(meta.parent), block[0]),
            meta.parent,
            meta.fingerprint,
            meta.kv_dtype,
            block,
        )
        self._put(link.key, [encode_link(link, chain[j])], chain, j, durable=False, counted=False)
        return True

    def _covers(self, key: str, tail: list[int], depth: int) -> bool:
        """Whether the record under ``key`` already holds ``tail`` or more of it (a longer partial block,
        or a link to a whole block that starts with it)."""
        head = self.store.head(key, HEAD_BYTES)
        stored = record_tokens(head) if head else None
        if stored is None or stored[: len(tail)] != tail:
            return False
        return self.store.touch([(key, depth)])[0]

    def _encode(self, part: KVSegment, meta: BlockMeta) -> list[memoryview | bytes]:
        stored = part.stored_parts()
        k = stored[0][0] if len(stored) == 1 else torch.cat([k for k, _ in stored], 2)
        v = stored[0][1] if len(stored) == 1 else torch.cat([v for _, v in stored], 2)
        return encode_block(meta, k, v)

    def _put(
        self,
        key: str,
        parts: Sequence[bytes | memoryview],
        chain: list[str],
        depth: int,
        *,
        durable: bool,
        counted: bool = True,
    ) -> bool:
        """Store one record unless the budget or the store refuses; False then."""
        clock, cpu = time.perf_counter(), time.thread_time()
        try:
            size = self.store.write(key, parts, durable=durable, depth=depth, keep={*chain, key})
        except StoreWriteError as exc:  # a full disk, Redis out of memory: skip, keep serving
            self.log.warning("%s KV tier: cannot write %s (%s)", self.name, self.store.describe(key), exc)
            self.counters.add(write_errors=1)
            return False
        if size is None:
            self.counters.add(write_dropped=1)
            return False
        if counted:
            elapsed, cpu = time.perf_counter() - clock, time.thread_time() - cpu
            self.counters.add(written_blocks=1, written_bytes=size, write_s=elapsed, write_cpu_s=cpu)
        return True
