"""Cache reuse is exact with int8 weights: a prompt whose prefix KV comes from the cache gives the same
logits, bit for bit, as the same prompt computed from scratch, wherever the prefix ends (on and off
the 64-token cache block boundary and the prefill chunk boundary) and however long the suffix is.

int8's matmul is row-independent by construction (engine.quant.linear); attention's rounding also depends on
a call's query and key counts, which engine.prefill_shapes pins down.
"""

import pytest
import torch

from engine.exact_reuse import check_exact_reuse
from engine.fused import FusedLlamaRunner
from engine.kv import BLOCK_TOKENS
from tests.engine.reuse_helpers import assert_as_stated

CHUNK = 256  # prefill chunk in this test, so ~600-token prompts cross chunk boundaries
CASES = [  # (cached prefix tokens, suffix tokens)
    (BLOCK_TOKENS, 1),
    (BLOCK_TOKENS - 1, 25),
    (BLOCK_TOKENS + 1, 300),
    (CHUNK, 7),
    (CHUNK - 1, 64),
    (CHUNK + 1, 290),
    (2 * BLOCK_TOKENS * 3, 25),
    (517, 1),
    (300, 300),
]


@pytest.fixture(scope="module")
def runner8(loaded_model):
    return FusedLlamaRunner(loaded_model.model, weights="int8", tokenizer=loaded_model.tokenizer)


def _prompt(n: int) -> list[int]:
    return torch.randint(200, 40000, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def _prefill(runner, ids, buffer):
    """What the engine does: the uncached part in chunks of CHUNK tokens; the last chunk's logits."""
    logits = None
    for start in range(0, len(ids), CHUNK):
        logits = runner.prefill(ids[start : start + CHUNK], buffer)
    return logits


@pytest.mark.parametrize(("prefix", "suffix"), CASES)
def test_cached_prefix_gives_the_same_logits(runner8, prefix, suffix):
    ids = _prompt(prefix + suffix)
    fresh = runner8.new_buffer(len(ids))
    expected = _prefill(runner8, ids, fresh)
    earlier = runner8.new_buffer(len(ids))  # an earlier request that computed the prefix
    _prefill(runner8, ids[:prefix], earlier)
    cached = runner8.new_buffer(len(ids))
    cached.load_prefix([earlier.segment(0, prefix).copy()])  # what the radix cache hands back
    got = _prefill(runner8, ids[prefix:], cached)
    assert_as_stated(runner8, got, expected, f"int8, prefix {prefix} + {suffix}")
    if not check_exact_reuse(runner8).exact:
        return
    k_fresh, v_fresh = fresh.stores()
    k_got, v_got = cached.stores()
    n = len(ids)
    assert torch.equal(k_got[:, :, :, :n], k_fresh[:, :, :, :n]) and torch.equal(
        v_got[:, :, :, :n], v_fresh[:, :, :, :n]
    )
