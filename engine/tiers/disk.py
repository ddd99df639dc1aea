"""DiskTier: the KV tier under the RAM prefix cache, in a folder that survives restarts and that the
replicas of one model may share.

  read:   a request's RAM match ─► extend(): the next whole 64-token blocks of its prompt whose files
          exist are read (in parallel), checked, and decoded into its buffer, then the partial block
          stored after them as far as its tokens are the prompt's; the engine's usual insert after the
          first token promotes all of it into RAM
  write:  every insert ─► persist(): a background writer looks up the prefix's KV in RAM and writes
          the blocks the folder lacks, then the partial block after them (write-behind; the queue is
          bounded, a full queue drops)

Blocks are content-addressed (engine.tiers.addresses): a file can only be found by the model, formats and
namespace that wrote it. Each file is checked before use (engine.tiers.blockfile); one that fails is a
miss, logged and deleted, never a crash and never loaded. Reads stop at the caller's limit, so the
engine's "at least one prompt token is computed" cap holds.

Example:
    >>> tier = DiskTier(Path("/srv/kv"), 8 << 30, fingerprint=fp, codec=codec,           # doctest: +SKIP
    ...                 geometry=KVGeometry(30, 3, 64), cache=engine.cache)
    >>> added = tier.extend(buffer, prompt_ids, namespace, limit=len(prompt_ids) - 1)   # doctest: +SKIP
    >>> tier.persist(namespace, prompt_ids)                                              # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.kv.codec import KVCodec, KVGeometry, compute_dtype
from engine.kv.state import BLOCK_TOKENS, KVBuffer, KVSegment
from engine.tiers.addresses import block_hashes, chain_root, model_fingerprint, tail_hash
from engine.tiers.blockfile import BlockMeta, read_block_file, read_block_tokens, write_block_file
from engine.tiers.directory import BlockDirectory
from prefix_cache import RadixCache
from prefix_cache.keys import common_prefix_len

log = logging.getLogger(__name__)

_HEADER_ALLOWANCE = 4096  # room reserved for a block file's header besides its tensors
_WRITER_NICE = 19  # the writer (and the writeback its fsync does) yields the CPU to the model's threads
_COUNTERS = (
    "lookups",  # requests that asked the disk for blocks after their RAM match
    "hit_requests",
    "hit_tokens",
    "read_blocks",
    "read_bytes",
    "read_s",
    "rejected",  # damaged or foreign files: each a miss, logged and deleted
    "written_blocks",
    "written_bytes",
    "write_s",
    "write_cpu_s",  # of it, CPU time the writer thread took from the model (the rest waits on the disk)
    "write_errors",  # e.g. a full disk: the block is skipped
    "write_dropped",  # prefixes not written: the queue was full or the budget too small
)


class DiskTier:
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
        self.fingerprint = fingerprint
        self.codec = codec
        self.kv_dtype = kv_dtype
        self.cache = cache
        self.geometry = geometry
        b = BLOCK_TOKENS
        self.k_shape = (geometry.layers, geometry.kv_heads, b, codec.stored_dim(geometry.head_dim))
        self.v_shape = (geometry.layers, geometry.kv_heads, b, codec.stored_dim(geometry.v_dim))
        itemsize = codec.stored_dtype.itemsize
        self._file_bytes = (math.prod(self.k_shape) + math.prod(self.v_shape)) * itemsize + _HEADER_ALLOWANCE
        self._local = threading.local()  # each reader thread's reusable read buffer
        self._counters: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self._lock = threading.Lock()
        self._roots: dict[str, bytes] = {}
        self._queue: queue.Queue[tuple[str, list[int]] | None] = queue.Queue(maxsize=queue_size)
        self._readers = ThreadPoolExecutor(read_threads, thread_name_prefix="prefixrag-kv-read")
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, name="prefixrag-kv-writer", daemon=True)
        self._writer.start()

    # ---- read -----------------------------------------------------------------------------------
    def extend(self, buffer: KVBuffer, tokens: Sequence[int], namespace: str, limit: int) -> int:
        """Append to ``buffer`` (which holds ``tokens[:buffer.length]``) the KV of the tokens after it that
        the disk holds (whole 64-token blocks, then a partial one), up to ``limit`` tokens in all; returns
        the tokens added (0 on any failure: the tier is an optimisation, the caller computes the rest)."""
        try:
            return self._extend(buffer, tokens, namespace, limit)
        except Exception as exc:
            log.warning("disk KV tier: read failed (%s); computing the prefix instead", exc)
            return 0

    def _extend(self, buffer: KVBuffer, tokens: Sequence[int], namespace: str, limit: int) -> int:
        start, b = buffer.length, BLOCK_TOKENS
        limit = min(limit, len(tokens))
        first, last = start // b, limit // b
        if start >= limit:
            return 0
        clock = time.perf_counter()
        keys = block_hashes(self._root(namespace), tokens[: last * b])
        run = list(itertools.takewhile(lambda j: self.folder.exists(keys[j]), range(first, last)))
        g = self.geometry
        buffer.ensure_storage(g.kv_heads, g.head_dim, self.codec.compute_dtype, "cpu", g.v_dim)
        buffer.reserve(limit)
        read = blocks = 0
        # each whole block is read, checked and decoded into its place by a reader thread
        for nbytes in self._readers.map(lambda j: self._load(buffer, keys, tokens, namespace, j), run):
            if not nbytes:
                break  # a block is useless without the ones before it
            read += nbytes
            blocks += 1
        end = (first + blocks) * b if blocks else start
        tail, nbytes = self._load_tail(buffer, keys, tokens, namespace, (first + blocks) * b, limit)
        end = max(end, tail)
        if end > start:
            buffer.set_length(end)
            now = time.time_ns()
            for j in range(first, first + blocks):
                self.folder.touch(keys[j], j, now)
        self._add(
            lookups=1,
            hit_requests=int(end > start),
            hit_tokens=end - start,
            read_blocks=blocks + int(nbytes > 0),
            read_bytes=read + nbytes,
            read_s=time.perf_counter() - clock,
        )
        return end - start

    def _load(self, buffer: KVBuffer, keys: list[str], tokens: Sequence[int], namespace: str, j: int) -> int:
        """Read whole block ``j`` into its place in ``buffer`` (the part past what the buffer holds); its
        stored bytes, or 0 if it is missing or fails a check (then nothing of it is used)."""
        b = BLOCK_TOKENS
        got = self._read(keys[j], self._meta(keys, namespace, j * b, keys[j], tokens[j * b : (j + 1) * b]))
        if got is None:
            return 0
        _, k, v = got
        skip = max(buffer.length - j * b, 0)  # tokens of it the RAM match already loaded
        buffer.write_at(j * b + skip, KVSegment.from_stored(k, v, self.codec)[skip:])
        return k.nbytes + v.nbytes

    def _load_tail(
        self, buffer: KVBuffer, keys: list[str], tokens: Sequence[int], namespace: str, pos: int, limit: int
    ) -> tuple[int, int]:
        """The partial block stored at ``pos``, as far as its tokens are the prompt's (and within
        ``limit``), into ``buffer``: (the end of what the buffer then holds validly, bytes read)."""
        if pos >= limit:
            return pos, 0
        key = tail_hash(self._parent(keys, namespace, pos), tokens[pos])
        if not self.folder.exists(key):
            return pos, 0
        got = self._read(key, self._meta(keys, namespace, pos, key, None))
        if got is None:
            return pos, 0
        stored, k, v = got
        shared = common_prefix_len(stored, list(tokens), pos, limit)
        skip = max(buffer.length - pos, 0)
        if shared <= skip:
            return pos, 0
        buffer.write_at(pos + skip, KVSegment.from_stored(k, v, self.codec)[skip:shared])
        self.folder.touch(key, pos // BLOCK_TOKENS, time.time_ns())
        return pos + shared, k.nbytes + v.nbytes

    def _read(self, key: str, meta: BlockMeta) -> tuple[list[int], torch.Tensor, torch.Tensor] | None:
        """A block file's contents after every check, in this thread's reusable buffer; None if it is
        missing or fails one (a damaged or foreign file is logged and deleted)."""
        path = self.folder.path(key)
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = np.empty(self._file_bytes, dtype=np.uint8)
        try:
            return read_block_file(path, meta, self._shapes, self.codec.stored_dtype, scratch)
        except FileNotFoundError:  # evicted since it was seen: a plain miss
            return None
        except Exception as exc:  # damaged, truncated, foreign or unreadable: never used
            log.warning("disk KV block %s rejected (%s); deleted", path, exc)
            self.folder.remove(key)
            self._add(rejected=1)
            return None

    def _shapes(self, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if not 0 < n <= BLOCK_TOKENS:
            raise ValueError(f"a block holds 1 to {BLOCK_TOKENS} tokens, not {n}")
        return (*self.k_shape[:2], n, self.k_shape[3]), (*self.v_shape[:2], n, self.v_shape[3])

    def _meta(
        self, keys: list[str], namespace: str, pos: int, key: str, block_tokens: Sequence[int] | None
    ) -> BlockMeta:
        parent = self._parent(keys, namespace, pos).hex()
        tokens = None if block_tokens is None else list(block_tokens)
        return BlockMeta(key, parent, self.fingerprint, self.kv_dtype, tokens)

    def _parent(self, keys: list[str], namespace: str, pos: int) -> bytes:
        """The address before position ``pos`` (a block boundary): the previous block's, or the root."""
        j = pos // BLOCK_TOKENS
        return bytes.fromhex(keys[j - 1]) if j else self._root(namespace)

    def _root(self, namespace: str) -> bytes:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = chain_root(self.fingerprint, namespace)
        return root

    # ---- write ----------------------------------------------------------------------------------
    def persist(self, namespace: str, tokens: Sequence[int]) -> None:
        """Queue ``tokens`` (just inserted into the RAM cache) for writing: their whole blocks and the
        partial block after them."""
        if not tokens or self._closed:
            return
        try:
            self._queue.put_nowait((namespace, list(tokens)))
        except queue.Full:
            self._add(write_dropped=1)

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued prefix is written; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def _write_loop(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's own priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICE)
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write_prefix(*item)
            except Exception:  # the writer outlives any one prefix
                log.exception("disk KV tier: writing a prefix failed")
            finally:
                self._queue.task_done()

    def _write_prefix(self, namespace: str, tokens: list[int]) -> None:
        b = BLOCK_TOKENS
        keys = block_hashes(self._root(namespace), tokens)
        whole = len(keys) * b
        now = time.time_ns()
        missing = [j for j, key in enumerate(keys) if not self.folder.touch(key, j, now)]  # touch = used
        tail_key = (
            tail_hash(self._parent(keys, namespace, whole), tokens[whole]) if whole < len(tokens) else None
        )
        if not missing and (tail_key is None or self._tail_covers(tail_key, tokens[whole:], len(keys), now)):
            return
        length, values = self.cache.peek_values(tokens, namespace)
        if not values:
            return
        chain = KVSegment.concat(values)
        for j in missing:
            if (j + 1) * b > length:
                return  # the RAM cache no longer (or never) held the rest
            meta = self._meta(keys, namespace, j * b, keys[j], tokens[j * b : (j + 1) * b])
            if not self._write_block(chain[j * b : (j + 1) * b], meta, keys, j, now):
                return
        if tail_key is not None and length > whole:
            meta = self._meta(keys, namespace, whole, tail_key, tokens[whole:length])
            self._write_block(chain[whole:length], meta, keys, len(keys), now)

    def _tail_covers(self, key: str, tail: list[int], depth: int, now: int) -> bool:
        """Whether the partial block stored under ``key`` already holds ``tail`` (or more of it)."""
        stored = read_block_tokens(self.folder.path(key))
        if stored is None or stored[: len(tail)] != tail:
            return False
        return self.folder.touch(key, depth, now)

    def _write_block(self, part: KVSegment, meta: BlockMeta, chain: list[str], depth: int, now: int) -> bool:
        """Write one block (whole or partial) unless the budget or the disk refuses; False then."""
        clock, cpu = time.perf_counter(), time.thread_time()
        stored = part.stored_parts()
        k = stored[0][0] if len(stored) == 1 else torch.cat([k for k, _ in stored], 2)
        v = stored[0][1] if len(stored) == 1 else torch.cat([v for _, v in stored], 2)
        key = meta.key
        if not self.folder.reserve(k.nbytes + v.nbytes + _HEADER_ALLOWANCE, keep={*chain, key}):
            self._add(write_dropped=1)
            return False
        path = self.folder.path(key)
        replaced = self.folder.size_of(key)  # a partial block is rewritten longer
        try:
            size = write_block_file(path, meta, k, v)
        except OSError as exc:  # a full or read-only disk: skip, keep serving
            log.warning("disk KV tier: cannot write %s (%s)", path, exc)
            self._add(write_errors=1)
            return False
        self.folder.added(size - replaced)
        self.folder.touch(key, depth, now)
        elapsed, cpu = time.perf_counter() - clock, time.thread_time() - cpu
        self._add(written_blocks=1, written_bytes=size, write_s=elapsed, write_cpu_s=cpu)
        return True

    # ---- the rest -------------------------------------------------------------------------------
    def _add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._counters[name] += amount

    def stats(self) -> dict[str, Any]:
        """Counters since start, the folder's bytes and budget, evictions, and the writer's queue."""
        with self._lock:
            out: dict[str, Any] = dict(self._counters)
        out.update(
            directory=str(self.folder.root),
            capacity_bytes=self.folder.capacity_bytes,
            used_bytes=self.folder.used_bytes,
            evictions=self.folder.evictions,
            evicted_bytes=self.folder.evicted_bytes,
            queue_depth=self._queue.unfinished_tasks,  # waiting or being written
        )
        return out

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop the writer and the readers."""
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._writer.join(timeout_s)
        self._readers.shutdown(wait=False)


def open_disk_tier(engine: Any, model: Any) -> DiskTier | None:
    """The disk tier ``engine.config`` asks for (None when it asks for none, or the folder cannot be
    used: logged, and the engine serves from RAM alone)."""
    cfg = engine.config
    if cfg.disk_cache_dir is None or cfg.disk_cache_bytes == 0:
        return None
    fingerprint = model_fingerprint(
        model,
        model_id=engine.model_id,
        dtype=str(compute_dtype(model)).removeprefix("torch."),
        kv_dtype=cfg.kv_dtype,
        weights=cfg.weights,
    )
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
