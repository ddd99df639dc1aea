import pytest
import torch

from engine.kv import KVBuffer, KVSegment
from engine.kv.codec import make_codec


def _seg(n: int, layers: int = 3, heads: int = 2, dim: int = 4, offset: float = 0.0) -> KVSegment:
    base = torch.arange(layers * heads * n * dim, dtype=torch.float32).view(layers, heads, n, dim) + offset
    return KVSegment(base, -base)


def test_segment_slices_are_views_and_copy_owns_memory():
    seg = _seg(10)
    view = seg[2:5]
    assert len(view) == 3
    assert (
        view.keys.data_ptr() != 0
        and view.keys.untyped_storage().data_ptr() == seg.keys.untyped_storage().data_ptr()
    )
    owned = view.copy()
    assert owned.keys.is_contiguous()
    assert owned.keys.untyped_storage().nbytes() == owned.keys.numel() * 4  # no larger buffer kept alive
    torch.testing.assert_close(owned.keys, seg.keys[:, :, 2:5])


def test_nbytes_is_exact():
    seg = _seg(7, layers=30, heads=3, dim=64)
    assert seg.nbytes == 2 * 30 * 3 * 7 * 64 * 4
    assert seg[0:1].nbytes == 2 * 30 * 3 * 64 * 4


@pytest.mark.parametrize("bad", [slice(0, 4, 2), 3])
def test_segment_rejects_non_contiguous_index(bad):
    with pytest.raises(TypeError):
        _seg(5)[bad]


def test_load_prefix_concatenates_segments_in_order():
    a, b = _seg(3), _seg(4, offset=1000.0)
    buf = KVBuffer(num_layers=3, capacity=4)  # too small on purpose: must grow
    assert buf.load_prefix([a, b]) == 7
    assert buf.length == 7
    whole = buf.segment(0, 7)
    torch.testing.assert_close(whole.keys, KVSegment.concat([a, b]).keys)
    torch.testing.assert_close(whole.values, KVSegment.concat([a, b]).values)
    k, _ = buf.stores()
    assert buf.layers[1].keys.shape == (1, 2, 7, 4)
    torch.testing.assert_close(buf.layers[1].keys[0], k[1, 0, :, :7])


def test_layer_views_follow_the_buffers_lengths_and_refuse_assignment():
    buf = KVBuffer(num_layers=2, capacity=8)
    buf.load_prefix([_seg(3, layers=2)])
    k, _ = buf.stores()
    with torch.inference_mode():  # a fused runner writes storage, then declares the length
        k[:, :, :, 3:5] = 7.0
    buf.set_length(5)
    assert buf.layers[1].keys.shape == (1, 2, 5, 4) and buf.layers[1].values.shape == (1, 2, 5, 4)
    assert bool((buf.layers[1].keys[0, :, 3:5] == 7.0).all())
    with pytest.raises(TypeError, match="views of its buffer"):
        buf.layers[0].keys = torch.zeros(1, 2, 2, 4)  # a crop would bypass the lengths


def test_update_appends_in_place_and_grows():
    buf = KVBuffer(num_layers=2, capacity=2)
    for step in range(5):
        for layer in range(2):
            k = torch.full((1, 2, 1, 4), float(step))
            keys, _ = buf.update(k, -k, layer)
            assert keys.shape == (1, 2, step + 1, 4)
    assert buf.length == 5
    assert buf.capacity >= 5
    torch.testing.assert_close(buf.segment(0, 5).keys[0, 0, :, 0], torch.arange(5.0))


def test_segment_bounds_checked():
    buf = KVBuffer(num_layers=3, capacity=8)
    buf.load_prefix([_seg(3)])
    with pytest.raises(ValueError, match="outside"):
        buf.segment(0, 4)


def test_truncate():
    buf = KVBuffer(num_layers=3, capacity=8)
    buf.load_prefix([_seg(6)])
    buf.truncate(2)
    assert buf.length == 2
    assert buf.get_seq_length() == 2


def test_copy_blocks_views_and_shares_owned_blocks():
    view = _seg(150)[5:150]  # a view, e.g. of a request's buffer
    owned = view.copy()
    assert [len(b) for b in owned.blocks] == [64, 64, 17]
    torch.testing.assert_close(owned.keys, _seg(150).keys[:, :, 5:150])
    # a radix split: both halves are copies, but whole owned blocks are shared, not copied
    left, right = owned[:100].copy(), owned[100:].copy()
    assert left.blocks[0] is owned.blocks[0]
    assert right.blocks[-1] is owned.blocks[-1]
    assert left.nbytes + right.nbytes == owned.nbytes
    torch.testing.assert_close(KVSegment.concat([left, right]).keys, owned.keys)


def test_split_halves_own_disjoint_memory():
    owned = _seg(130).copy()
    left, right = owned[:70].copy(), owned[70:].copy()
    left_ptrs = {b.keys.untyped_storage().data_ptr() for b in left.blocks}
    right_ptrs = {b.keys.untyped_storage().data_ptr() for b in right.blocks}
    assert not left_ptrs & right_ptrs


def test_radix_cache_split_keeps_values_exact():
    from prefix_cache import RadixCache

    cache = RadixCache(capacity_bytes=1 << 30)
    seg = _seg(200)
    cache.insert(list(range(200)), seg)
    m = cache.match_prefix([*range(120), 999])
    assert m.length == 120
    torch.testing.assert_close(KVSegment.concat(m.values).keys, seg.keys[:, :, :120])
    full = cache.match_prefix(list(range(200)))
    torch.testing.assert_close(KVSegment.concat(full.values).values, seg.values)
    assert cache.used_bytes == seg.nbytes


# ---- stored formats (engine.kv.codec) -----------------------------------------------------------


def _raw(n: int, layers: int = 3, heads: int = 2, dim: int = 64) -> KVSegment:
    gen = torch.Generator().manual_seed(n)
    keys = torch.randn(layers, heads, n, dim, generator=gen)
    return KVSegment(keys, keys * 0.5 + 1, codec=make_codec("int8", torch.float32))


def test_int8_segment_stores_compactly_and_decodes_to_the_rounded_values():
    raw = _raw(150)
    codec = raw.codec
    assert raw.nbytes == 2 * 3 * 2 * 150 * 66  # what the cache will hold, before the copy
    stored = raw[5:150].copy()
    assert stored.nbytes == raw[5:150].nbytes
    assert all(b.stored and b.keys.dtype == torch.int8 and b.keys.shape[3] == 66 for b in stored.blocks)
    assert torch.equal(stored.keys, codec.round(raw.keys[:, :, 5:150]))
    assert torch.equal(stored.values, codec.round(raw.values[:, :, 5:150]))
    k, v = stored.decoded(torch.float64)
    assert k.dtype == v.dtype == torch.float64 and torch.equal(k, codec.round(raw.keys[:, :, 5:150]).double())
    assert [p[0].dtype for p in stored.parts()] == [torch.float32] * 3  # parts() are raw, decoded
    assert [p[0].dtype for p in stored.stored_parts()] == [torch.int8] * 3


def test_stored_slices_copy_without_re_encoding():
    stored = _raw(150).copy()
    left, right = stored[:100].copy(), stored[100:].copy()  # a radix split through a block
    assert left.blocks[0] is stored.blocks[0]
    for half, whole in ((left, stored[:100]), (right, stored[100:])):
        assert [torch.equal(a[0], b[0]) for a, b in zip(half.stored_parts(), whole.stored_parts())]
        assert torch.equal(half.keys, whole.keys)
    assert left.nbytes + right.nbytes == stored.nbytes


def test_load_prefix_decodes_stored_segments_exactly():
    raw = _raw(100)
    stored = raw.copy()
    buf = KVBuffer(num_layers=3, capacity=8)  # grows
    assert buf.load_prefix([stored[:30], stored[30:]]) == 100
    k, v = buf.stores()
    assert k.dtype == torch.float32 and k.shape[-1] == 64
    assert torch.equal(k[:, 0, :, :100], raw.codec.round(raw.keys))
    assert torch.equal(v[:, 0, :, :100], raw.codec.round(raw.values))
    assert buf.extend([stored[:10]]) == 10 and buf.length == 110  # a disk tier appends after a RAM match
    k, _ = buf.stores()  # grown
    assert torch.equal(k[:, 0, :, :100], raw.codec.round(raw.keys))
    assert torch.equal(k[:, 0, :, 100:110], raw.codec.round(raw.keys[:, :, :10]))


def test_buffer_rounds_what_the_model_writes():
    codec = make_codec("bfloat16", torch.float32)
    buf = KVBuffer(num_layers=1, capacity=4, codec=codec)
    k = torch.randn(1, 2, 3, 8)
    keys, values = buf.update(k, -k, 0)
    assert torch.equal(keys[0], k[0].bfloat16().float()) and torch.equal(values[0], -k[0].bfloat16().float())
    seg = buf.segment(0, 3)
    assert seg.codec is codec and seg.nbytes == 2 * 2 * 3 * 8 * 2


def test_pooled_int8_blocks():
    from engine.kv.block_pool import KVBlockPool

    pool = KVBlockPool(block_tokens=64, slab_bytes=1 << 20)
    raw = _raw(130)
    owned = KVSegment(raw.keys, raw.values, pool, raw.codec).copy()
    assert [b.slot is not None for b in owned.blocks] == [True, True, False]  # the 2-token tail is its own
    assert pool.stats()["used_blocks"] == 2
    assert torch.equal(owned.keys, raw.codec.round(raw.keys))


def test_concat_refuses_mixed_formats():
    with pytest.raises(ValueError, match="different KV formats"):
        KVSegment.concat([_raw(3), _seg(3)])


def test_from_stored_checks_the_dtype():
    with pytest.raises(ValueError, match=r"stored int8 KV must be torch\.int8"):
        KVSegment.from_stored(
            torch.zeros(1, 1, 2, 66), torch.zeros(1, 1, 2, 66), make_codec("int8", torch.float32)
        )
