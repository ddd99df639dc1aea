import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.kv import KVBuffer
from engine.kv.buffer_pool import BufferPool

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
            for keys, values in eng.buffers._free:
                keys.fill_(float("nan"))
                values.fill_(float("nan"))
        warm = eng.generate(prompt, params, namespace="a")  # cached prefix loaded into poisoned storage
        cold = eng.generate(prompt, params, namespace="b")  # full prefill into poisoned storage
        assert warm.cached_tokens > 0 and cold.cached_tokens == 0
        assert warm.token_ids == cold.token_ids == first.token_ids
    finally:
        eng.close()
    assert eng.buffers.nbytes == 0  # close lets go of the pool
