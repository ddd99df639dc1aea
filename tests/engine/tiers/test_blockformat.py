"""Block records as bytes (a file's or a Redis value's): links round-trip and are checked like blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.tiers.blockfile import read_block_file, write_record
from engine.tiers.blockformat import (
    Block,
    BlockError,
    BlockMeta,
    Link,
    decode_record,
    encode_block,
    encode_link,
)

META = BlockMeta(
    key="ab" * 32, parent="cd" * 32, fingerprint="ef" * 32, kv_dtype="int8", tokens=list(range(64))
)
ANY = BlockMeta(**{**META.__dict__, "tokens": None})


def _shapes(n: int):
    return (2, 3, n, 66), (2, 3, n, 66)


def _bytes(parts) -> np.ndarray:
    return np.frombuffer(b"".join(parts), dtype=np.uint8).copy()


def test_a_block_decodes_from_bytes_to_views_of_them():
    k = torch.randint(-127, 128, (2, 3, 64, 66), dtype=torch.int8)
    data = _bytes(encode_block(META, k, k + 1))
    record = decode_record(data, META, _shapes, torch.int8)
    assert isinstance(record, Block) and torch.equal(record.keys, k) and torch.equal(record.values, k + 1)
    assert record.keys.data_ptr() >= data.ctypes.data  # no copy


def test_a_link_round_trips_and_is_checked_like_a_block(tmp_path):
    target = "12" * 32
    data = _bytes([encode_link(META, target)])
    record = decode_record(data, ANY, _shapes, torch.int8)
    assert record == Link(target, list(range(64)))
    for field, other in (("key", "00" * 32), ("parent", "11" * 32), ("fingerprint", "22" * 32)):
        with pytest.raises(BlockError, match=f"another {field}"):
            decode_record(data, BlockMeta(**{**ANY.__dict__, field: other}), _shapes, torch.int8)
    damaged = data.copy()
    damaged[20] ^= 1
    with pytest.raises(BlockError, match="header checksum"):
        decode_record(damaged, ANY, _shapes, torch.int8)
    path = tmp_path / "link.kvb"
    write_record(path, [encode_link(META, target)], durable=False)
    with pytest.raises(BlockError, match="a link, not a block"):
        read_block_file(path, ANY, _shapes, torch.int8)


def test_a_link_must_name_a_block_address():
    data = _bytes([encode_link(META, "not-an-address")])
    with pytest.raises(BlockError, match="names no block address"):
        decode_record(data, ANY, _shapes, torch.int8)
