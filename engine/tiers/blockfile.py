"""The disk tier's files: one block record (engine.tiers.blockformat) per file, written atomically.

A write goes to a temp file in the same folder, is fsynced (``durable``) and renamed into place with
``os.replace``: a reader never sees half a file, and two writers of the same record (same content, by
construction) simply replace one another. A read fills a reusable scratch array when it fits (reused
memory is not faulted in again on every read).

Example:
    >>> size = write_block_file(Path("/tmp/x.kvb"), meta, k, v)                        # doctest: +SKIP
    >>> tokens, keys, values = read_block_file(Path("/tmp/x.kvb"), meta, lambda n: (k.shape, v.shape),
    ...                                        torch.int8)                              # doctest: +SKIP
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from engine.tiers.blockformat import (
    HEAD_BYTES,
    Block,
    BlockError,
    BlockMeta,
    Shapes,
    decode_record,
    encode_block,
    record_tokens,
)

TEMP_PREFIX = ".tmp-"  # then the writer's pid: a crashed writer's leftovers are recognisable


def write_record(path: Path, parts: Sequence[bytes | memoryview], *, durable: bool = True) -> int:
    """Write one record atomically (temp file, fsync when ``durable``, rename); returns its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TEMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    size = 0
    try:
        with open(tmp, "wb") as fh:
            for part in parts:
                size += fh.write(part)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size


def read_record(path: Path, scratch: np.ndarray | None = None) -> np.ndarray:
    """A file's bytes, in ``scratch`` (a uint8 array) when it fits, else in a new array; a view of it
    is valid until the scratch is reused. FileNotFoundError passes through (a plain miss)."""
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        fits = scratch is not None and scratch.nbytes >= size
        data = scratch[:size] if fits else np.empty(size, dtype=np.uint8)  # type: ignore[index]
        view = memoryview(data)  # type: ignore[arg-type]  # numpy arrays are buffers
        done = 0
        while done < size:
            n = fh.readinto(view[done:])
            if not n:
                raise BlockError(f"short read: {done} of {size} bytes")
            done += n
    return data


def read_head(path: Path, nbytes: int = HEAD_BYTES) -> bytes:
    """A file's first ``nbytes`` (its header, for a look at its tokens)."""
    with open(path, "rb") as fh:
        return fh.read(nbytes)


def write_block_file(path: Path, meta: BlockMeta, keys: torch.Tensor, values: torch.Tensor) -> int:
    """Write one block record durably; returns the file's size in bytes."""
    return write_record(path, encode_block(meta, keys, values))


def read_block_file(
    path: Path,
    expect: BlockMeta,
    shapes: Shapes,
    dtype: torch.dtype,
    scratch: np.ndarray | None = None,
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The (tokens, keys, values) of a block file, after every check; BlockError if any fails or the
    file holds a link. ``expect.tokens`` None accepts whatever tokens it holds (a partial block)."""
    record = decode_record(read_record(path, scratch), expect, shapes, dtype)
    if not isinstance(record, Block):
        raise BlockError("a link, not a block")
    return record.tokens, record.keys, record.values


def read_block_tokens(path: Path) -> list[int] | None:
    """The token ids a block file's header claims (None if it has none, or no readable header)."""
    try:
        return record_tokens(read_head(path))
    except OSError:
        return None
