"""The KV block record: the bytes of one disk-tier file and of one Redis value.

A record is one 64-token KV block (or a prefix's partial last block) as plain tensors behind a JSON
header, or a link: a header only, naming the latest whole block written after a parent whose first
token is the link's, with that block's token ids (so a prompt that diverges inside the block finds it
and uses the tokens both share).

Layout (little-endian)::

    b"PRKVBLK1"                      8 bytes, the format
    header length, header CRC-32     2 x uint32
    header                           UTF-8 JSON: address, parent, fingerprint, kv_dtype, token ids,
                                     tensors [{name, dtype, shape}], payload bytes and CRC-32, and for
                                     a link the target's address; padded with spaces to a multiple of 64
    payload                          the keys' bytes, then the values' bytes (C order, stored form)

Nothing is unpickled: a reader checks the sizes, both checksums and every header field against what it
expects (address, parent, model fingerprint, tokens, shapes) before it builds tensors over the bytes,
and anything else is a `BlockError` naming what was wrong.

Example:
    >>> meta = BlockMeta(key="ab" * 32, parent="cd" * 32, fingerprint="ef" * 32, kv_dtype="int8",
    ...                  tokens=list(range(64)))
    >>> k = v = torch.zeros(2, 3, 64, 66, dtype=torch.int8)
    >>> data = np.frombuffer(b"".join(encode_block(meta, k, v)), dtype=np.uint8).copy()
    >>> decode_record(data, meta, lambda n: (k.shape, v.shape), torch.int8).tokens == meta.tokens
    True
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

MAGIC = b"PRKVBLK1"
FORMAT_VERSION = 1
HEAD_BYTES = 4096  # a header (64 token ids and the fields) fits in this many leading bytes
_PREFIX = struct.Struct("<8sII")  # magic, header length, header crc32
_MAX_HEADER = 1 << 20
_ALIGN = 64
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8}
_HEX64 = re.compile(r"[0-9a-f]{64}")

Shapes = Callable[[int], tuple[Sequence[int], Sequence[int]]]  # tokens -> (keys shape, values shape)


class BlockError(ValueError):
    """A record that must not be used: truncated, corrupt, or written for something else."""


@dataclass(frozen=True)
class BlockMeta:
    """What a record claims to hold, and what a reader expects it to hold."""

    key: str  # the record's address (hex)
    parent: str  # the previous block's address, or the chain root (hex)
    fingerprint: str  # engine.tiers.addresses.model_fingerprint
    kv_dtype: str
    tokens: list[int] | None  # None when reading: any tokens (a partial block, a link)


@dataclass(frozen=True)
class Block:
    """A block record's token ids and tensors (views of the bytes it was decoded from)."""

    tokens: list[int]
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys) + _nbytes(self.values)


@dataclass(frozen=True)
class Link:
    """A link record: the whole block at ``target`` holds ``tokens``."""

    target: str
    tokens: list[int]


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in _DTYPES.items() if d == dtype)


def encode_block(meta: BlockMeta, keys: torch.Tensor, values: torch.Tensor) -> list[memoryview | bytes]:
    """A block record's parts: the header, then the keys' and the values' bytes (not copied)."""
    parts = [_byte_view(keys), _byte_view(values)]
    crc = zlib.crc32(parts[1], zlib.crc32(parts[0]))
    tensors = [
        {"name": name, "dtype": dtype_name(t.dtype), "shape": list(t.shape)}
        for name, t in (("keys", keys), ("values", values))
    ]
    return [_header(meta, tensors, _nbytes(keys) + _nbytes(values), crc), *parts]


def encode_link(meta: BlockMeta, target: str) -> bytes:
    """A link record at ``meta.key`` to the whole block ``target``, which holds ``meta.tokens``."""
    return _header(meta, [], 0, zlib.crc32(b""), link=target)


def _header(
    meta: BlockMeta, tensors: list[dict], payload_bytes: int, crc: int, link: str | None = None
) -> bytes:
    header = {
        "format": FORMAT_VERSION,
        "key": meta.key,
        "parent": meta.parent,
        "fingerprint": meta.fingerprint,
        "kv_dtype": meta.kv_dtype,
        "tokens": list(meta.tokens or ()),
        "tensors": tensors,
        "payload_bytes": payload_bytes,
        "payload_crc32": crc,
    }
    if link is not None:
        header["link"] = link
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-(_PREFIX.size + len(body)) % _ALIGN)  # the payload starts aligned for every dtype
    return _PREFIX.pack(MAGIC, len(body), zlib.crc32(body)) + body


def decode_record(data: np.ndarray, expect: BlockMeta, shapes: Shapes, dtype: torch.dtype) -> Block | Link:
    """The block or link ``data`` (a writable uint8 array: a record's bytes) holds, after every check;
    `BlockError` if any fails. ``shapes(n)`` is what n tokens' tensors must be; a block's tensors are
    views of ``data``."""
    view = memoryview(data)  # type: ignore[arg-type]  # numpy arrays are buffers
    header, offset = parse_header(view)
    tokens, tensor_shapes = _check_header(header, expect, shapes, dtype)
    if offset % _ALIGN:
        raise BlockError("payload is not aligned")
    payload = view[offset:]
    if len(payload) != header["payload_bytes"]:
        raise BlockError(f"payload is {len(payload)} bytes, the header says {header['payload_bytes']}")
    if zlib.crc32(payload) != header["payload_crc32"]:
        raise BlockError("payload checksum mismatch")
    if tensor_shapes is None:
        return Link(header["link"], tokens)
    k_shape, v_shape = tensor_shapes
    flat = torch.from_numpy(data)[offset:]
    k_bytes = _numel(k_shape) * _itemsize(dtype)
    keys = flat[:k_bytes].view(dtype).view(*k_shape)
    values = flat[k_bytes:].view(dtype).view(*v_shape)
    return Block(tokens, keys, values)


def record_tokens(head: bytes) -> list[int] | None:
    """The token ids a record's header claims, from its first bytes (None if there is no readable header)."""
    try:
        header, _ = parse_header(memoryview(head))
    except (BlockError, struct.error):
        return None
    tokens = header.get("tokens")
    return tokens if isinstance(tokens, list) else None


def parse_header(view: memoryview) -> tuple[dict, int]:
    """A record's header (checked against its checksum) and where its payload starts."""
    if len(view) < _PREFIX.size:
        raise BlockError(f"truncated: {len(view)} bytes")
    magic, length, crc = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise BlockError("not a prefixrag KV block file")
    if length > _MAX_HEADER or _PREFIX.size + length > len(view):
        raise BlockError(f"truncated header ({len(view)} bytes, header claims {length})")
    body = view[_PREFIX.size : _PREFIX.size + length]
    if zlib.crc32(body) != crc:
        raise BlockError("header checksum mismatch")
    try:
        header = json.loads(bytes(body))
    except ValueError as exc:
        raise BlockError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise BlockError("header is not a JSON object")
    return header, _PREFIX.size + length


def _check_header(
    header: dict, expect: BlockMeta, shapes: Shapes, dtype: torch.dtype
) -> tuple[list[int], tuple[Sequence[int], Sequence[int]] | None]:
    """The header's tokens and tensor shapes (None for a link) once every field is what ``expect`` says."""
    tokens = header.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(type(t) is int for t in tokens):
        raise BlockError("the header has no token ids")
    if expect.tokens is not None and tokens != list(expect.tokens):
        raise BlockError("written for another tokens (model, namespace, prefix or format)")
    link = header.get("link")
    k_shape, v_shape = shapes(len(tokens))
    tensors = [
        {"name": "keys", "dtype": dtype_name(dtype), "shape": list(k_shape)},
        {"name": "values", "dtype": dtype_name(dtype), "shape": list(v_shape)},
    ]
    want = {
        "format": FORMAT_VERSION,
        "key": expect.key,
        "parent": expect.parent,
        "fingerprint": expect.fingerprint,
        "kv_dtype": expect.kv_dtype,
        "tensors": [] if link is not None else tensors,
    }
    for field, value in want.items():
        if header.get(field) != value:
            raise BlockError(f"written for another {field} (model, namespace, prefix or format)")
    if link is not None and not (isinstance(link, str) and _HEX64.fullmatch(link)):
        raise BlockError("the link names no block address")
    expected = 0 if link is not None else (_numel(k_shape) + _numel(v_shape)) * _itemsize(dtype)
    if header.get("payload_bytes") != expected or not isinstance(header.get("payload_crc32"), int):
        raise BlockError("payload size or checksum field is wrong")
    return tokens, None if link is not None else (k_shape, v_shape)


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
