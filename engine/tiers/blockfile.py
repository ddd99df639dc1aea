"""The disk tier's file format: one 64-token KV block per file, plain tensors behind a JSON header.

Layout (little-endian)::

    b"PRKVBLK1"                      8 bytes, the format
    header length, header CRC-32     2 x uint32
    header                           UTF-8 JSON: address, parent, fingerprint, kv_dtype, token ids,
                                     tensors [{name, dtype, shape}], payload bytes and CRC-32;
                                     padded with spaces to a multiple of 64 bytes
    payload                          the keys' bytes, then the values' bytes (C order, stored form)

Nothing is unpickled: a reader checks the sizes, both checksums and every header field against what it
expects (address, parent, model fingerprint, tokens, shapes) before it builds tensors over the bytes,
and anything else is a `BlockFileError` naming what was wrong. Writes are atomic: a temp file in the
same folder, fsync, ``os.replace``; a reader never sees half a file, and two writers of the same block
(same content, by construction) simply replace one another.

Example:
    >>> meta = BlockMeta(key="ab" * 32, parent="cd" * 32, fingerprint="ef" * 32, kv_dtype="int8",
    ...                  tokens=list(range(64)))
    >>> k = v = torch.zeros(30, 3, 64, 66, dtype=torch.int8)
    >>> size = write_block_file(Path("/tmp/x.kvb"), meta, k, v)             # doctest: +SKIP
    >>> tokens, keys, values = read_block_file(Path("/tmp/x.kvb"), meta, lambda n: (k.shape, v.shape),
    ...                                        torch.int8)                                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import struct
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

MAGIC = b"PRKVBLK1"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")  # magic, header length, header crc32
_MAX_HEADER = 1 << 20
_ALIGN = 64
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8}


class BlockFileError(ValueError):
    """A block file that must not be used: truncated, corrupt, or written for something else."""


@dataclass(frozen=True)
class BlockMeta:
    """What a block file claims to hold, and what a reader expects it to hold."""

    key: str  # the block's address (hex)
    parent: str  # the previous block's address, or the chain root (hex)
    fingerprint: str  # engine.tiers.addresses.model_fingerprint
    kv_dtype: str
    tokens: list[int] | None  # None when reading: any tokens (a partial last block)


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in _DTYPES.items() if d == dtype)


def encode_header(meta: BlockMeta, keys: torch.Tensor, values: torch.Tensor, payload_crc: int) -> bytes:
    header = {
        "format": FORMAT_VERSION,
        "key": meta.key,
        "parent": meta.parent,
        "fingerprint": meta.fingerprint,
        "kv_dtype": meta.kv_dtype,
        "tokens": list(meta.tokens or ()),
        "tensors": [
            {"name": name, "dtype": dtype_name(t.dtype), "shape": list(t.shape)}
            for name, t in (("keys", keys), ("values", values))
        ],
        "payload_bytes": _nbytes(keys) + _nbytes(values),
        "payload_crc32": payload_crc,
    }
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-(_PREFIX.size + len(body)) % _ALIGN)  # the payload starts aligned for every dtype
    return _PREFIX.pack(MAGIC, len(body), zlib.crc32(body)) + body


def write_block_file(path: Path, meta: BlockMeta, keys: torch.Tensor, values: torch.Tensor) -> int:
    """Write one block atomically (temp file, fsync, rename); returns the file's size in bytes."""
    parts = [_byte_view(keys), _byte_view(values)]
    crc = zlib.crc32(parts[1], zlib.crc32(parts[0]))
    header = encode_header(meta, keys, values, crc)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TEMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(header)
            for part in parts:
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(header) + len(parts[0]) + len(parts[1])


TEMP_PREFIX = ".tmp-"  # then the writer's pid: a crashed writer's leftovers are recognisable


Shapes = Callable[[int], tuple[Sequence[int], Sequence[int]]]  # tokens -> (keys shape, values shape)


def read_block_file(
    path: Path,
    expect: BlockMeta,
    shapes: Shapes,
    dtype: torch.dtype,
    scratch: np.ndarray | None = None,
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The (tokens, keys, values) of a block file, after every check; BlockFileError if any fails.
    FileNotFoundError passes through (a block another process evicted is a plain miss).

    ``expect.tokens`` None accepts whatever tokens the file holds (a prefix's last, partial block: the
    caller uses what they share with its prompt); ``shapes(n)`` is what n tokens' tensors must be.
    With ``scratch`` (a uint8 array at least the file's size) the file is read into it and the tensors
    are views of it, valid until it is reused: reused memory is not faulted in again on every read."""
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        fits = scratch is not None and scratch.nbytes >= size
        data = scratch[:size] if fits else np.empty(size, dtype=np.uint8)  # type: ignore[index]
        view = memoryview(data)  # type: ignore[arg-type]  # numpy arrays are buffers
        done = 0
        while done < size:
            n = fh.readinto(view[done:])
            if not n:
                raise BlockFileError(f"short read: {done} of {size} bytes")
            done += n
    header, offset = _parse_header(view)
    tokens, (k_shape, v_shape) = _check_header(header, expect, shapes, dtype)
    if offset % _ALIGN:
        raise BlockFileError("payload is not aligned")
    payload = view[offset:]
    if len(payload) != header["payload_bytes"]:
        raise BlockFileError(f"payload is {len(payload)} bytes, the header says {header['payload_bytes']}")
    if zlib.crc32(payload) != header["payload_crc32"]:
        raise BlockFileError("payload checksum mismatch")
    flat = torch.from_numpy(data)[offset:]
    k_bytes = _numel(k_shape) * _itemsize(dtype)
    keys = flat[:k_bytes].view(dtype).view(*k_shape)
    values = flat[k_bytes:].view(dtype).view(*v_shape)
    return tokens, keys, values


def read_block_tokens(path: Path) -> list[int] | None:
    """The token ids a block file's header claims (None if it has none, or no readable header)."""
    try:
        with open(path, "rb") as fh:
            prefix = fh.read(_PREFIX.size)
            length = _PREFIX.unpack_from(prefix)[1] if len(prefix) == _PREFIX.size else 0
            header, _ = _parse_header(memoryview(prefix + fh.read(min(length, _MAX_HEADER))))
    except (OSError, BlockFileError, struct.error):
        return None
    tokens = header.get("tokens")
    return tokens if isinstance(tokens, list) else None


def _parse_header(view: memoryview) -> tuple[dict, int]:
    if len(view) < _PREFIX.size:
        raise BlockFileError(f"truncated: {len(view)} bytes")
    magic, length, crc = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise BlockFileError("not a prefixrag KV block file")
    if length > _MAX_HEADER or _PREFIX.size + length > len(view):
        raise BlockFileError(f"truncated header ({len(view)} bytes, header claims {length})")
    body = view[_PREFIX.size : _PREFIX.size + length]
    if zlib.crc32(body) != crc:
        raise BlockFileError("header checksum mismatch")
    try:
        header = json.loads(bytes(body))
    except ValueError as exc:
        raise BlockFileError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise BlockFileError("header is not a JSON object")
    return header, _PREFIX.size + length


def _check_header(
    header: dict, expect: BlockMeta, shapes: Shapes, dtype: torch.dtype
) -> tuple[list[int], tuple[Sequence[int], Sequence[int]]]:
    tokens = header.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(type(t) is int for t in tokens):
        raise BlockFileError("the header has no token ids")
    if expect.tokens is not None and tokens != list(expect.tokens):
        raise BlockFileError("written for another tokens (model, namespace, prefix or format)")
    k_shape, v_shape = shapes(len(tokens))
    want = {
        "format": FORMAT_VERSION,
        "key": expect.key,
        "parent": expect.parent,
        "fingerprint": expect.fingerprint,
        "kv_dtype": expect.kv_dtype,
        "tensors": [
            {"name": "keys", "dtype": dtype_name(dtype), "shape": list(k_shape)},
            {"name": "values", "dtype": dtype_name(dtype), "shape": list(v_shape)},
        ],
    }
    for field, value in want.items():
        if header.get(field) != value:
            raise BlockFileError(f"written for another {field} (model, namespace, prefix or format)")
    expected = (_numel(k_shape) + _numel(v_shape)) * _itemsize(dtype)
    if header.get("payload_bytes") != expected or not isinstance(header.get("payload_crc32"), int):
        raise BlockFileError("payload size or checksum field is wrong")
    return tokens, (k_shape, v_shape)


def _byte_view(t: torch.Tensor) -> memoryview:
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")  # type: ignore[arg-type]


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
