"""The disk tier's block files: exact round trips, and every kind of damage refused with a reason."""

import json
import struct
import zlib

import pytest
import torch

from engine.tiers.blockfile import read_block_file, read_block_tokens, write_block_file
from engine.tiers.blockformat import MAGIC, BlockError, BlockMeta

META = BlockMeta(
    key="ab" * 32, parent="cd" * 32, fingerprint="ef" * 32, kv_dtype="int8", tokens=list(range(64))
)
SHAPE = (2, 3, 64, 66)


def _tensors(dtype: torch.dtype = torch.int8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    if dtype == torch.int8:
        return tuple(torch.randint(-127, 128, SHAPE, generator=gen, dtype=torch.int8) for _ in range(2))  # type: ignore[return-value]
    return torch.randn(2, 3, 64, 64, generator=gen).to(dtype), torch.randn(2, 3, 64, 64, generator=gen).to(
        dtype
    )


def _read(path, meta=META, dtype=torch.int8, shape=SHAPE):
    return read_block_file(path, meta, lambda n: (shape, shape), dtype)[1:]


@pytest.mark.parametrize("dtype", [torch.int8, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_round_trip_is_exact(tmp_path, dtype):
    keys, values = _tensors(dtype)
    path = tmp_path / "ab" / "block.kvb"
    size = write_block_file(path, META, keys, values)
    assert size == path.stat().st_size and size % 64 == 0  # payload aligned; header padded to 64 bytes
    tokens, k, v = read_block_file(path, META, lambda n: (keys.shape, values.shape), dtype)
    assert tokens == META.tokens and torch.equal(k, keys) and torch.equal(v, values)
    assert [p.name for p in path.parent.iterdir()] == ["block.kvb"]  # no temp file left behind


def _damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flipped payload byte":
        data[-1000] ^= 0x10
    elif how == "flipped header byte":
        data[40] ^= 0x01
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "truncated header":
        data = data[:30]
    elif how == "empty":
        data = bytearray()
    elif how == "not a block file":
        data = bytearray(b"\x80\x04K\x01." + bytes(100))  # e.g. a pickle: never unpickled, just refused
    elif how == "longer":
        data += b"\0" * 64
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("flipped payload byte", "payload checksum"),
        ("flipped header byte", "header checksum"),
        ("truncated", "payload is"),
        ("truncated header", "truncated"),
        ("empty", "truncated"),
        ("not a block file", "not a prefixrag KV block file"),
        ("longer", "payload is"),
    ],
)
def test_damaged_files_are_refused(tmp_path, how, reason):
    path = tmp_path / "b.kvb"
    write_block_file(path, META, *_tensors())
    _damage(path, how)
    with pytest.raises(BlockError, match=reason):
        _read(path)


@pytest.mark.parametrize(
    "field",
    ["key", "parent", "fingerprint", "kv_dtype", "tokens"],
)
def test_a_file_written_for_something_else_is_refused(tmp_path, field):
    path = tmp_path / "b.kvb"
    write_block_file(path, META, *_tensors())
    other = {"key": "00" * 32, "parent": "11" * 32, "fingerprint": "22" * 32, "kv_dtype": "bfloat16"}
    expect = BlockMeta(
        **{**META.__dict__, **({field: other[field]} if field != "tokens" else {"tokens": [7] * 64})}
    )
    with pytest.raises(BlockError, match=f"another {field}"):
        _read(path, expect)


def test_other_shapes_or_dtypes_are_refused(tmp_path):
    path = tmp_path / "b.kvb"
    write_block_file(path, META, *_tensors())
    with pytest.raises(BlockError, match="another tensors"):
        _read(path, shape=(2, 3, 64, 64), dtype=torch.int8)
    with pytest.raises(BlockError, match="another tensors"):
        _read(path, dtype=torch.float16, shape=(2, 3, 64, 33))


def test_a_consistent_but_lying_header_is_refused(tmp_path):
    """A header rewritten with a valid checksum but a wrong payload size is still refused."""
    path = tmp_path / "b.kvb"
    write_block_file(path, META, *_tensors())
    data = path.read_bytes()
    _, length, _ = struct.unpack_from("<8sII", data)
    header = json.loads(data[16 : 16 + length])
    header["payload_bytes"] += 64
    body = json.dumps(header).encode()
    path.write_bytes(MAGIC + struct.pack("<II", len(body), zlib.crc32(body)) + body + data[16 + length :])
    with pytest.raises(BlockError):
        _read(path)


def test_a_partial_block_is_read_with_whatever_tokens_it_holds(tmp_path):
    path = tmp_path / "tail.kvb"
    keys, values = (t[:, :, :5] for t in _tensors())
    write_block_file(path, BlockMeta(**{**META.__dict__, "tokens": [9, 8, 7, 6, 5]}), keys, values)
    expect = BlockMeta(**{**META.__dict__, "tokens": None})
    tokens, k, v = read_block_file(path, expect, lambda n: ((2, 3, n, 66), (2, 3, n, 66)), torch.int8)
    assert tokens == [9, 8, 7, 6, 5] and torch.equal(k, keys) and torch.equal(v, values)
    assert read_block_tokens(path) == [9, 8, 7, 6, 5]
    with pytest.raises(BlockError, match="another tokens"):
        read_block_file(path, META, lambda n: ((2, 3, n, 66), (2, 3, n, 66)), torch.int8)
    path.write_bytes(b"junk")
    assert read_block_tokens(path) is None


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        _read(tmp_path / "nope.kvb")


def test_a_full_disk_leaves_no_temp_file(small_tmpfs):
    keys, values = _tensors(torch.float32)  # ~200 KB: does not fit the 64 KiB tmpfs
    with pytest.raises(OSError):
        write_block_file(small_tmpfs / "ab" / "b.kvb", META, keys, values)
    assert not [p for p in small_tmpfs.rglob("*") if p.is_file()]
