"""BlockTier: a KV tier of 64-token blocks in a `BlockStore` (a folder, a Redis server); the policy
both the disk and the Redis tier run.

  read:   a request's match so far ─► extend(): the next whole blocks of its prompt the store holds are
          read in parallel (engine.tiers.readers), checked and decoded into its buffer; then the record
          after them, found by the prompt's next token: a partial block, or a link to a whole block
          another prompt wrote there, used as far as its tokens are the prompt's (a prompt that diverges
          inside a block reuses it up to the last shared token)
  write:  every insert ─► persist(): the writer thread (engine.tiers.writer) looks the prefix's KV up
          in RAM and writes the blocks the store lacks, each with a link at its first token, then the
          partial block after them (engine.tiers.block_writes; write-behind, a full queue drops)

Records are content-addressed (engine.tiers.addresses): only the model, formats and namespace that
wrote one can name it. Each is checked before use (engine.tiers.blockformat); one that fails is a miss,
logged and deleted, never a crash and never loaded. A store that cannot be reached is a miss too.
Reads stop at the caller's limit, so the engine's "at least one prompt token is computed" cap holds.

Example:
    >>> tier = BlockTier(store, name="disk", fingerprint=fp, codec=codec, kv_dtype="float32",  # doctest: +SKIP
    ...                  geometry=KVGeometry(30, 3, 64), cache=engine.cache, log=log)
    >>> added = tier.extend(buffer, prompt_ids, namespace, limit=len(prompt_ids) - 1)   # doctest: +SKIP
    >>> tier.persist(namespace, prompt_ids)                                              # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.kv.codec import KVCodec, KVGeometry
from engine.kv.state import BLOCK_TOKENS, KVBuffer, KVSegment
from engine.tiers.addresses import PrefixAddresses, block_address, block_hashes, tail_hash
from engine.tiers.block_writes import BlockWrites
from engine.tiers.blockformat import (
    Block,
    BlockError,
    BlockMeta,
    Link,
    decode_record,
)
from engine.tiers.readers import ReaderPool
from engine.tiers.stats import TierCounters
from engine.tiers.store import BlockStore, StoreUnavailable
from engine.tiers.writer import WriteBehind
from prefix_cache import RadixCache
from prefix_cache.keys import common_prefix_len

HEADER_ALLOWANCE = 4096  # room for a record's header besides its tensors


class BlockTier:
    """KV blocks in ``store`` under the RAM cache ``cache`` (see the module docstring)."""

    def __init__(
        self,
        store: BlockStore,
        *,
        name: str,
        fingerprint: str,
        codec: KVCodec,
        kv_dtype: str,
        geometry: KVGeometry,
        cache: RadixCache,
        log: logging.Logger,
        queue_size: int = 256,
        read_threads: int = 4,
        idle: Callable[[], None] | None = None,
        idle_s: float = 5.0,
    ) -> None:
        self.name = name
        self.store = store
        self.codec = codec
        self.geometry = geometry
        self.cache = cache
        self.log = log
        b = BLOCK_TOKENS
        self.k_shape = (geometry.layers, geometry.kv_heads, b, codec.stored_dim(geometry.head_dim))
        self.v_shape = (geometry.layers, geometry.kv_heads, b, codec.stored_dim(geometry.v_dim))
        itemsize = codec.stored_dtype.itemsize
        record_bytes = (math.prod(self.k_shape) + math.prod(self.v_shape)) * itemsize + HEADER_ALLOWANCE
        self.counters = TierCounters()
        self.addresses = PrefixAddresses(fingerprint, kv_dtype)
        self.readers = ReaderPool(threads=read_threads, scratch_bytes=record_bytes, name=name)
        writes = BlockWrites(
            store, self.addresses, codec=codec, cache=cache, counters=self.counters, name=name, log=log
        )
        self.writer = WriteBehind(
            writes.write_prefix, name=name, queue_size=queue_size, idle=idle, idle_s=idle_s
        )

    # ---- read -----------------------------------------------------------------------------------
    def extend(self, buffer: KVBuffer, tokens: Sequence[int], namespace: str, limit: int) -> int:
        """Append to ``buffer`` (which holds ``tokens[:buffer.length]``) the KV of the tokens after it
        that the store holds, up to ``limit`` tokens in all; the tokens added (0 on any failure: the
        tier is an optimisation, the caller computes the rest)."""
        try:
            return self._extend(buffer, tokens, namespace, limit)
        except StoreUnavailable:  # the store logs the outage once
            self.counters.add(unavailable=1)
        except Exception as exc:
            self.log.warning("%s KV tier: read failed (%s); computing the prefix instead", self.name, exc)
        return 0

    def _extend(self, buffer: KVBuffer, tokens: Sequence[int], namespace: str, limit: int) -> int:
        start, b = buffer.length, BLOCK_TOKENS
        limit = min(limit, len(tokens))
        if start >= limit:
            return 0
        clock = time.perf_counter()
        first = start // b
        reaching = tokens[: -(-limit // b) * b]  # the blocks with a token before limit
        chain = block_hashes(self.addresses.root(namespace), reaching)
        present = self.store.exists(chain[first:])
        run = [j for j, _ in itertools.takewhile(lambda jp: jp[1], enumerate(present, first))]
        g = self.geometry
        buffer.ensure_storage(g.kv_heads, g.head_dim, self.codec.compute_dtype, "cpu", g.v_dim)
        buffer.reserve(limit)
        # each block is read, checked and decoded into its place by a reader thread
        loaded = self.readers.run_all(
            lambda j, scratch: self._load(buffer, chain, tokens, namespace, j, limit, scratch), run
        )
        blocks = sum(1 for _ in itertools.takewhile(bool, loaded))  # a block is useless without its parents
        read = sum(loaded[:blocks])
        pos = (first + blocks) * b
        end, nbytes = (min(pos, limit) if blocks else start), 0
        if pos < limit:
            tail, nbytes = self._load_tail(buffer, chain, tokens, namespace, pos, limit)
            end = max(end, tail)
        if end > start:
            buffer.set_length(end)
            self.store.used([(chain[j], j) for j in range(first, first + blocks)])
        self.counters.add(
            lookups=1,
            hit_requests=int(end > start),
            hit_tokens=end - start,
            read_blocks=blocks + int(nbytes > 0),
            read_bytes=read + nbytes,
            read_s=time.perf_counter() - clock,
        )
        return end - start

    def _load(
        self,
        buffer: KVBuffer,
        chain: list[str],
        tokens: Sequence[int],
        namespace: str,
        j: int,
        limit: int,
        scratch: np.ndarray,
    ) -> int:
        """Read whole block ``j`` into its place in ``buffer`` (the part past what the buffer holds, up
        to ``limit``); its stored bytes, or 0 if it is missing or fails a check (nothing of it is used)."""
        b = BLOCK_TOKENS
        meta = self.addresses.meta(chain, namespace, j * b, chain[j], tokens[j * b : (j + 1) * b])
        block = self._read(chain[j], meta, scratch, Block)
        if not isinstance(block, Block):
            return 0
        skip = max(buffer.length - j * b, 0)  # tokens of it the match so far already loaded
        seg = KVSegment.from_stored(block.keys, block.values, self.codec)[skip : limit - j * b]
        buffer.write_at(j * b + skip, seg)
        return block.nbytes

    def _load_tail(
        self, buffer: KVBuffer, chain: list[str], tokens: Sequence[int], namespace: str, pos: int, limit: int
    ) -> tuple[int, int]:
        """The record after block boundary ``pos`` for the prompt's next token (a partial block, or a
        link to a whole block), as far as its tokens are the prompt's and within ``limit``, into
        ``buffer``: (the end of what the buffer then holds validly, bytes read)."""
        parent = self.addresses.parent(chain, namespace, pos)
        key = tail_hash(parent, tokens[pos])
        scratch = self.readers.scratch()
        record = self._read(key, self.addresses.meta(chain, namespace, pos, key, None), scratch)
        if isinstance(record, Link):
            target = block_address(parent, record.tokens).hex()
            if len(record.tokens) != BLOCK_TOKENS or record.target != target:
                self._reject(key, BlockError("the link names another block than its tokens'"))
                return pos, 0
            shared = common_prefix_len(record.tokens, list(tokens), pos, limit)
            if shared <= buffer.length - pos:
                return pos, 0
            meta = self.addresses.meta(chain, namespace, pos, target, record.tokens)
            record, key = self._read(target, meta, scratch, Block), target
        if not isinstance(record, Block):
            return pos, 0
        shared = common_prefix_len(record.tokens, list(tokens), pos, limit)
        skip = max(buffer.length - pos, 0)
        if shared <= skip:
            return pos, 0
        buffer.write_at(
            pos + skip, KVSegment.from_stored(record.keys, record.values, self.codec)[skip:shared]
        )
        self.store.used([(key, pos // BLOCK_TOKENS)])
        return pos + shared, record.nbytes

    def _read(
        self, key: str, meta: BlockMeta, scratch: np.ndarray, kind: type | None = None
    ) -> Block | Link | None:
        """A record after every check (its tensors view ``scratch``); None if it is missing, the store
        is unreachable, or it fails a check (then it is logged and deleted)."""
        try:
            data = self.store.read(key, scratch)
        except StoreUnavailable:
            self.counters.add(unavailable=1)
            return None
        except Exception as exc:  # unreadable: never used
            self._reject(key, exc)
            return None
        if data is None:  # evicted since it was seen: a plain miss
            return None
        try:
            record = decode_record(data, meta, self._shapes, self.codec.stored_dtype)
            if kind is not None and not isinstance(record, kind):
                raise BlockError(f"a {type(record).__name__.lower()} where a block belongs")
        except Exception as exc:  # damaged, truncated or foreign
            self._reject(key, exc)
            return None
        return record

    def _reject(self, key: str, exc: BaseException) -> None:
        self.log.warning("%s KV block %s rejected (%s); deleted", self.name, self.store.describe(key), exc)
        self.counters.add(rejected=1)
        with contextlib.suppress(StoreUnavailable):
            self.store.remove(key)

    def _shapes(self, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if not 0 < n <= BLOCK_TOKENS:
            raise BlockError(f"a block holds 1 to {BLOCK_TOKENS} tokens, not {n}")
        return (*self.k_shape[:2], n, self.k_shape[3]), (*self.v_shape[:2], n, self.v_shape[3])

    # ---- write ----------------------------------------------------------------------------------
    def persist(self, namespace: str, tokens: Sequence[int]) -> None:
        """Queue ``tokens`` (just inserted into the RAM cache) for writing: their whole blocks and the
        partial block after them."""
        if tokens and not self.writer.submit(namespace, list(tokens)):
            self.counters.add(write_dropped=1)

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued prefix is written; False if ``timeout_s`` passed first."""
        return self.writer.flush(timeout_s)

    # ---- the rest -------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters since start, what the store reports, and the writer's queue."""
        return {**self.counters.snapshot(), **self.store.stats(), "queue_depth": self.writer.depth}

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop the writer, the readers and the store."""
        self.writer.close(timeout_s)
        self.readers.close()
        self.store.close()
