import gc

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.kv import BLOCK_TOKENS, KVBuffer, KVSegment
from engine.kv.block_pool import KVBlockPool
from prefix_cache import RadixCache

LAYERS, HEADS, DIM = 2, 1, 4
BLOCK_BYTES = 2 * LAYERS * HEADS * BLOCK_TOKENS * DIM * 4
SMOLLM2_BYTES_PER_TOKEN = 46_080  # float32: 30 layers x 2 x 3 kv heads x 64 dims x 4 bytes


def _buffer(tokens: int, offset: float = 0.0) -> KVBuffer:
    buf = KVBuffer(LAYERS, tokens)
    buf.ensure_storage(heads=HEADS, head_dim=DIM, dtype=torch.float32)
    k, v = buf.stores()
    k.copy_(torch.arange(k.numel(), dtype=torch.float32).view_as(k) + offset)
    v.copy_(-k)
    buf.set_length(tokens)
    return buf


def _block(value: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    keys = torch.full((LAYERS, HEADS, BLOCK_TOKENS, DIM), value)
    return keys, -keys


def test_a_slot_goes_back_when_nothing_uses_it_and_is_reused():
    pool = KVBlockPool(BLOCK_TOKENS, slab_bytes=4 * BLOCK_BYTES)
    slot = pool.take(*_block())
    assert slot is not None and pool.stats()["used_blocks"] == 1 and pool.stats()["slabs"] == 1
    index = slot.index
    del slot
    assert pool.stats()["used_blocks"] == 0
    again = pool.take(*_block())
    assert again is not None and again.index == index  # recycled, no new slab
    assert pool.stats() == {"slabs": 1, "slab_bytes": 4 * BLOCK_BYTES, "used_blocks": 1, "free_blocks": 3}


def test_other_shapes_and_partial_blocks_are_not_pooled():
    pool = KVBlockPool(BLOCK_TOKENS, slab_bytes=4 * BLOCK_BYTES)
    keep = pool.take(*_block())
    partial = torch.zeros(LAYERS, HEADS, BLOCK_TOKENS - 1, DIM)
    assert pool.take(partial, partial) is None
    other = torch.zeros(LAYERS + 1, HEADS, BLOCK_TOKENS, DIM)
    assert pool.take(other, other) is None  # the pool's kind is fixed by its first block
    assert pool.take(*_block()) is not None and keep is not None


def test_a_full_slab_makes_another_and_an_empty_one_is_dropped_when_spare():
    pool = KVBlockPool(BLOCK_TOKENS, slab_bytes=2 * BLOCK_BYTES)
    slots = [pool.take(*_block()) for _ in range(5)]
    assert pool.stats()["slabs"] == 3
    del slots[:4]  # the first two slabs empty out; one of them is kept as spare
    assert pool.stats() == {"slabs": 2, "slab_bytes": 4 * BLOCK_BYTES, "used_blocks": 1, "free_blocks": 3}
    with pytest.raises(ValueError, match="block_tokens"):
        KVBlockPool(0)


def test_copy_puts_whole_blocks_in_the_pool_and_keeps_values_exact():
    pool = KVBlockPool(BLOCK_TOKENS, slab_bytes=8 * BLOCK_BYTES)
    buf = _buffer(2 * BLOCK_TOKENS + 5)
    seg = buf.segment(0, buf.length, pool)
    owned = seg.copy()
    assert [b.slot is not None for b in owned.blocks] == [True, True, False]  # the 5-token tail is its own
    assert pool.stats()["used_blocks"] == 2
    torch.testing.assert_close(owned.keys, seg.keys)
    torch.testing.assert_close(owned.values, seg.values)
    assert owned.nbytes == seg.nbytes
    buf.k_store.fill_(float("nan"))  # the copy shares nothing with the buffer
    assert not owned.keys.isnan().any()


def test_a_view_keeps_its_slot_from_being_reused():
    pool = KVBlockPool(BLOCK_TOKENS, slab_bytes=8 * BLOCK_BYTES)
    owned = _buffer(BLOCK_TOKENS).segment(0, BLOCK_TOKENS, pool).copy()
    view = owned[3:10]  # what a match ending mid-node hands out
    expected = view.keys.clone()
    del owned
    gc.collect()
    assert pool.stats()["used_blocks"] == 1  # the view still holds the slot
    for _ in range(8):  # would overwrite the slot if it had been given back
        slot = pool.take(*_block(7.0))
        assert slot is not None
        slot.keys.fill_(7.0)
    torch.testing.assert_close(view.keys, expected)


def test_radix_cache_eviction_recycles_slots_within_its_budget():
    pool = KVBlockPool(BLOCK_TOKENS, slab_bytes=2 * BLOCK_BYTES)
    tokens = 3 * BLOCK_TOKENS
    cache = RadixCache(capacity_bytes=2 * tokens * BLOCK_BYTES // BLOCK_TOKENS)  # room for two prompts
    for i in range(20):
        buf = _buffer(tokens, offset=1000.0 * i)
        prompt = [i * 10_000 + t for t in range(tokens)]
        cache.insert(prompt, buf.segment(0, tokens, pool))
        m = cache.match_prefix(prompt)
        assert m.length == tokens
        torch.testing.assert_close(KVSegment.concat(m.values).keys, buf.segment(0, tokens).keys)
    stats = pool.stats()
    assert stats["used_blocks"] == 6  # two prompts of three blocks
    assert stats["slab_bytes"] <= 6 * BLOCK_BYTES + pool.slab_bytes  # the peak plus one slab
    del m  # a match holds its blocks (and their slots) like any view
    cache.reset()
    gc.collect()
    assert pool.stats()["used_blocks"] == 0 and pool.stats()["slabs"] == 1


def test_engine_output_is_unchanged_under_constant_eviction(loaded_model):
    """A budget of about one prompt shared by two tenants: every request evicts the other tenant's
    blocks and reuses their slots, and stale slot contents never reach an output."""
    kw = {"model_id": loaded_model.model_id}
    base = " ".join(f"Fact {i}: the code word for item {i} is w{i * 7}." for i in range(12))
    prompts = [f"{base} Question {q}: what is the code word for item {q}?" for q in range(3)]
    off = Engine(
        loaded_model.model, loaded_model.tokenizer, **kw, config=EngineConfig(enable_prefix_cache=False)
    )
    tokens = len(off.encode(prompts[0]))
    budget = (tokens + BLOCK_TOKENS) * SMOLLM2_BYTES_PER_TOKEN
    eng = Engine(loaded_model.model, loaded_model.tokenizer, **kw, config=EngineConfig(cache_bytes=budget))
    try:
        params = SamplingParams(max_tokens=6)
        expected = [off.generate(p, params).token_ids for p in prompts]
        hits = 0
        for round_ in range(2):
            for tenant in ("a", "b"):
                for prompt, want in zip(prompts, expected, strict=True):
                    got = eng.generate(prompt, params, namespace=tenant)
                    assert got.token_ids == want, (round_, tenant, prompt[-40:])
                    hits += got.cached_tokens > 0
        stats = eng.stats()
        assert hits >= 8 and stats["cache"]["evictions"] >= 3
        assert stats["kv_slabs"]["used_blocks"] * BLOCK_TOKENS * SMOLLM2_BYTES_PER_TOKEN <= budget
    finally:
        eng.close()
        off.close()
