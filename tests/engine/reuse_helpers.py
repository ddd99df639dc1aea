"""Cached against uncached runs of one runner, as the engine chunks and caches them, judged by what
the engine states for that runner on this machine (engine.exact_reuse); and batched against solo
decode of one runner, which every runner promises bit for bit."""

from __future__ import annotations

import pydoc_data.topics

import torch

from engine import EngineConfig
from engine.exact_reuse import check_exact_reuse
from engine.kv import KVBuffer
from prefix_cache import RadixCache

CHUNK = EngineConfig.model_fields["prefill_chunk_tokens"].default
# where the engine states exact_reuse false, reuse differs by float rounding within these bounds on
# the logits (README, "Exact reuse"), and the greedy token is the same
ROUNDING_BOUND = {torch.float32: 1e-3, torch.bfloat16: 0.5}


def assert_batched_equals_solo(runner, prompts: list[list[int]], steps: int = 3) -> None:
    """A few decode steps of ``prompts`` as one batch give each row's solo logits to the bit (later
    steps attend over KV the batched steps wrote)."""
    capacity = max(len(p) for p in prompts) + steps + 1
    batch = [runner.new_buffer(capacity) for _ in prompts]
    solo = [runner.new_buffer(capacity) for _ in prompts]
    tokens = []
    for p, b, s in zip(prompts, batch, solo):
        tokens.append(int(runner.prefill(p, b).argmax()))
        runner.prefill(p, s)
    for _ in range(steps):
        rows = runner.decode_batch(tokens, batch)
        alone = [runner.decode_step(t, s) for t, s in zip(tokens, solo)]
        assert all(torch.equal(r, a) for r, a in zip(rows, alone))
        tokens = [int(r.argmax()) for r in rows]


def assert_as_stated(runner, reused: torch.Tensor, computed: torch.Tensor, what: str = "") -> None:
    """``reused`` logits equal ``computed`` bit for bit where the engine states exact reuse for this
    runner here; elsewhere within the documented rounding bound, with the same greedy token."""
    verdict = check_exact_reuse(runner)
    diff = float((reused.float() - computed.float()).abs().max())
    if verdict.exact:
        assert torch.equal(reused, computed), (
            f"{what}: max |diff| {diff:.3g}, yet stated exact: {verdict.reason}"
        )
        return
    assert int(reused.argmax()) == int(computed.argmax()), f"{what}: another greedy token ({verdict.reason})"
    assert diff <= ROUNDING_BOUND[runner.dtype], (
        f"{what}: max |diff| {diff:.3g} over the bound ({verdict.reason})"
    )


def real_text_ids(tokenizer, tokens: int) -> list[int]:
    """The first ``tokens`` token ids of the Python language reference CPython ships."""
    text = "\n\n".join(pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics))
    ids = tokenizer.encode(text[: tokens * 10])
    assert len(ids) >= tokens
    return ids[:tokens]


def prefill(runner, buffer: KVBuffer, ids: list[int]) -> torch.Tensor:
    """Prefill ``ids`` after what ``buffer`` holds, in the engine's chunks; logits of the last one."""
    for start in range(0, len(ids), CHUNK):
        logits = runner.prefill(ids[start : start + CHUNK], buffer)
    return logits


class ColdAndWarm:
    """One runner's uncached and cached results for the prefixes of one long prompt.

    Example:
        >>> runs = ColdAndWarm(runner, ids)                                  # doctest: +SKIP
        >>> cold_logits, cold_kv = runs.cold(1100)
        >>> warm_logits, warm_kv = runs.warm(cached=1023, n=1100, source=len(ids))
    """

    def __init__(self, runner, ids: list[int]) -> None:
        self.runner = runner
        self.ids = ids
        self.full = runner.new_buffer(len(ids))
        self.full_logits = prefill(runner, self.full, ids)
        self.cache = RadixCache(capacity_bytes=1 << 34)
        self.cache.insert(ids, self.full.segment(0, len(ids)))

    def cold(self, n: int) -> tuple[torch.Tensor, KVBuffer]:
        """Uncached prefill of ``ids[:n]``. Its chunk calls before the last are the long run's own (same
        tokens, same positions), so their KV is copied from it rather than computed again."""
        if n == len(self.ids):
            return self.full_logits, self.full
        last = (n - 1) // CHUNK * CHUNK
        buffer = self.runner.new_buffer(n)
        if last:
            buffer.load_prefix([self.full.segment(0, last)])
        return prefill(self.runner, buffer, self.ids[last:n]), buffer

    def warm(self, cached: int, n: int, source: int) -> tuple[torch.Tensor, KVBuffer]:
        """``ids[:n]`` with its first ``cached`` tokens' KV taken from the prefix cache, where an earlier
        request for ``ids[:source]`` put it."""
        cache = self.cache
        if source != len(self.ids):
            earlier = self.runner.new_buffer(source)
            prefill(self.runner, earlier, self.ids[:source])
            cache = RadixCache(capacity_bytes=1 << 34)
            cache.insert(self.ids[:source], earlier.segment(0, source))
        match = cache.match_prefix(self.ids[:n], max_length=cached)
        assert match.length == cached
        buffer = self.runner.new_buffer(n)
        buffer.load_prefix(match.values)
        return prefill(self.runner, buffer, self.ids[cached:n]), buffer

    def assert_as_stated(self, cached: int, n: int, source: int) -> None:
        """Logits (and, where reuse is stated exact, every layer's KV) of ``ids[:n]`` cached and
        uncached agree as the engine states (:func:`assert_as_stated`)."""
        cold_logits, cold_kv = self.cold(n)
        warm_logits, warm_kv = self.warm(cached, n, source)
        assert_as_stated(self.runner, warm_logits, cold_logits, f"prefix {cached} + {n - cached}")
        if check_exact_reuse(self.runner).exact:
            cold_seg, warm_seg = cold_kv.segment(0, n), warm_kv.segment(0, n)
            assert torch.equal(warm_seg.keys, cold_seg.keys) and torch.equal(warm_seg.values, cold_seg.values)
