import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.kv import KVBuffer
from engine.kv.buffer_pool import BufferPool, Held, Want, common_prefix
from engine.request import final_result
from tests.engine.reuse_helpers import assert_as_stated, real_text_ids

LAYERS, HEADS, DIM = 2, 1, 4


def _new(capacity: int) -> KVBuffer:
    return KVBuffer(LAYERS, capacity)


def _used(pool: BufferPool, capacity: int) -> KVBuffer:
    buf = pool.take(_new, capacity)
    buf.ensure_storage(HEADS, DIM, torch.float32)
    return buf


def test_a_given_back_buffer_is_recycled_for_a_request_that_fits():
    pool = BufferPool(max_bytes=1 << 20)
    first = _used(pool, 16)
    storage = first.k_store.data_ptr()
    pool.give(first)
    assert first.k_store is None  # the old owner lets go
    again = pool.take(_new, 10)
    assert again.k_store.data_ptr() == storage and again.capacity == 16 and again.length == 0
    assert pool.nbytes == 0
    bigger = pool.take(_new, 32)  # nothing kept fits: a new buffer, storage allocated on first use
    assert bigger.k_store is None and bigger.capacity == 32


def test_the_smallest_fitting_storage_is_taken():
    pool = BufferPool(max_bytes=1 << 20)
    large, small = _used(pool, 64), _used(pool, 16)
    pool.give(large)
    pool.give(small)
    assert pool.take(_new, 12).capacity == 16
    assert pool.take(_new, 12).capacity == 64


def test_the_byte_budget_drops_the_oldest_and_zero_keeps_nothing():
    one = _used(BufferPool(0), 16)
    size = one.nbytes
    pool = BufferPool(max_bytes=2 * size)
    bufs = [_used(pool, 16) for _ in range(3)]
    ptrs = [b.k_store.data_ptr() for b in bufs]
    for b in bufs:
        pool.give(b)
    assert pool.nbytes == 2 * size
    assert {pool.take(_new, 16).k_store.data_ptr() for _ in range(2)} == set(ptrs[1:])
    none = BufferPool(0)
    none.give(one)
    assert none.nbytes == 0
    with pytest.raises(ValueError, match="max_bytes"):
        BufferPool(-1)


def test_adopt_storage_checks_shapes():
    buf = KVBuffer(LAYERS, 8)
    with pytest.raises(ValueError, match="layers"):
        buf.adopt_storage(torch.zeros(3, 1, HEADS, 8, DIM), torch.zeros(3, 1, HEADS, 8, DIM))
    buf.adopt_storage(torch.zeros(LAYERS, 1, HEADS, 8, DIM), torch.zeros(LAYERS, 1, HEADS, 8, DIM))
    with pytest.raises(ValueError, match="without storage"):
        buf.adopt_storage(torch.zeros(LAYERS, 1, HEADS, 8, DIM), torch.zeros(LAYERS, 1, HEADS, 8, DIM))


@pytest.mark.parametrize("runner", ["fast", "hf"])
def test_recycled_storage_full_of_nan_changes_no_output(loaded_model, runner):
    """Stale contents of a recycled buffer are never read: poisoned with NaN, outputs stay the same."""
    config = EngineConfig(model=loaded_model.model_id, runner=runner)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        params = SamplingParams(max_tokens=12)
        prompt = "The capital of France is Paris. The capital of Italy is"
        first = eng.generate(prompt, params, namespace="a")
        assert eng.stats()["buffer_pool_bytes"] > 0
        with torch.inference_mode():  # the storage was made inside the model's forward
            for kept in eng.buffers._free:  # past the KV a kept buffer holds for the next request
                start = len(kept.held.tokens) if kept.held is not None else 0
                kept.keys[:, :, :, start:].fill_(float("nan"))
                kept.values[:, :, :, start:].fill_(float("nan"))
        warm = eng.generate(prompt, params, namespace="a")  # cached prefix loaded into poisoned storage
        cold = eng.generate(prompt, params, namespace="b")  # full prefill into poisoned storage
        assert warm.cached_tokens > 0 and cold.cached_tokens == 0
        assert warm.token_ids == cold.token_ids == first.token_ids
    finally:
        eng.close()
    assert eng.buffers.nbytes == 0  # close lets go of the pool


def _holding(pool: BufferPool, capacity: int, held: Held) -> int:
    """Give the pool a new buffer that holds ``held``'s tokens; its storage's address."""
    buf = _new(capacity)
    buf.ensure_storage(HEADS, DIM, torch.float32)
    buf.set_length(len(held.tokens))
    ptr = buf.k_store.data_ptr()
    pool.give(buf, held)
    return ptr


def test_a_held_prefix_goes_to_a_request_of_its_namespace_up_to_its_match():
    pool = BufferPool(max_bytes=1 << 20)
    ptr = _holding(pool, 16, Held("a", (1, 2, 3, 4, 5)))
    other = pool.take(_new, 8, Want("b", [1, 2, 3, 4, 5], 5))  # another tenant: the storage, empty
    assert other.k_store.data_ptr() == ptr and other.length == 0
    pool.give(other, None)
    assert pool.take(_new, 8, Want("a", [1, 2, 3, 9], 4)).length == 0  # held nothing, now
    _holding(pool, 16, Held("a", (1, 2, 3, 4, 5)))
    assert pool.take(_new, 8, Want("a", [1, 2, 3, 4, 9], 3)).length == 3  # no further than the match


def test_the_storage_holding_most_of_the_prompt_is_taken_grown_to_fit():
    pool = BufferPool(max_bytes=1 << 20)
    _holding(pool, 16, Held("a", (1, 2)))
    _holding(pool, 16, Held("a", (1, 2, 3, 4)))
    _holding(pool, 16, Held("a", (7, 8, 9)))
    taken = pool.take(_new, 40, Want("a", [1, 2, 3, 4, 5], 5))
    assert taken.length == 4 and taken.capacity >= 40  # grown, what it holds kept
    with pytest.raises(ValueError, match="cannot hold"):
        pool.give(_used(pool, 16), Held("a", (1, 2, 3)))  # holding 0 tokens


@pytest.mark.parametrize(
    ("a", "b", "limit", "shared"),
    [
        ((), [1], 5, 0),
        ((1, 2, 3), [1, 2, 3], 9, 3),
        ((1, 2, 3), [1, 2, 4], 9, 2),
        ((1, 2, 3), [1, 2, 3], 1, 1),
    ],
)
def test_common_prefix(a, b, limit, shared):
    assert common_prefix(a, b, limit) == shared
    long = list(range(3000))
    assert common_prefix(tuple(long), long[:1777] + [-1] + long[1778:], 3000) == 1777


def test_a_finished_requests_kv_starts_the_next_prompt_that_shares_its_prefix(
    loaded_model, engine, engine_nocache
):
    """A question changed at its end starts on the buffer of the request before it (the prefix's KV
    not copied again) and gets what a full prefill gives, as the engine states reuse here."""
    ids = real_text_ids(loaded_model.tokenizer, 330)
    first, second = ids[:300], ids[:280] + ids[310:330]
    assert ids[280] != ids[310]
    engine.generate(first, SamplingParams(max_tokens=3), namespace="held")
    before = engine.stats()["held_tokens"]
    continuation = ids[300:304]
    reused = final_result(engine.score(second, continuation, namespace="held"))
    assert engine.stats()["held_tokens"] - before == 280 and reused.cached_tokens == 280
    computed = final_result(engine_nocache.score(second, continuation))
    for row in range(len(continuation)):
        assert_as_stated(engine.runner, reused.scores[row], computed.scores[row], f"row {row}")
