"""Radix-cache micro-benchmark: per-call match / insert latency on a synthetic RAG-like request stream.

The stream: Zipf-popular shared prefixes (system prompt + retrieved context, 500-2,000 tokens) followed
by a unique suffix (the question). Each request does what the engine does: match (capped at len-1,
locked), insert the whole prompt (only the uncached part is copied), unlock. Values are float32 rows
of `bytes_per_token` bytes, handed over as views of one big buffer, as the engine does.

Example:
    >>> from rag.benchmark.radix_bench import run_radix_bench
    >>> out = run_radix_bench(levels=(5_000,), requests=50, policies=("lru",))
    >>> sorted(out["results"]["lru"]["5000"])[:3]
    ['cached_tokens', 'evictions', 'hit_rate']
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Sequence
from typing import Any

from prefix_cache.radix import RadixCache


def make_stream(
    num_requests: int,
    *,
    num_prefixes: int = 64,
    prefix_len: tuple[int, int] = (500, 2000),
    suffix_len: tuple[int, int] = (16, 256),
    zipf_s: float = 1.1,
    vocab: int = 49_152,
    seed: int = 0,
) -> list[list[int]]:
    """`num_requests` token lists: a Zipf(s)-chosen shared prefix plus a unique random suffix."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab) for _ in range(rng.randint(*prefix_len))] for _ in range(num_prefixes)]
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(num_prefixes)]
    picks = rng.choices(range(num_prefixes), weights=weights, k=num_requests)
    return [prefixes[p] + [rng.randrange(vocab) for _ in range(rng.randint(*suffix_len))] for p in picks]


def _summary(ns: Sequence[int]) -> dict[str, float]:
    """Median / p95 / mean of nanosecond samples, in microseconds."""
    xs = sorted(ns)
    if not xs:
        return {"median": 0.0, "p95": 0.0, "mean": 0.0}
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return {"median": xs[len(xs) // 2] / 1e3, "p95": p95 / 1e3, "mean": sum(xs) / len(xs) / 1e3}


def _request(cache: RadixCache, tokens: list[int], value: Any) -> tuple[int, int]:
    """One engine-style request; returns (match ns, insert ns)."""
    t0 = time.perf_counter_ns()
    m = cache.match_prefix(tokens, max_length=len(tokens) - 1, lock=True)
    t1 = time.perf_counter_ns()
    cache.insert(tokens, value)
    t2 = time.perf_counter_ns()
    cache.unlock(m.node)
    return t1 - t0, t2 - t1


def _bench_level(
    cache: RadixCache, stream: list[list[int]], fixed: list[list[int]], buf: Any, requests: int
) -> dict[str, Any]:
    i = 0
    while cache.used_bytes < 0.9 * cache.capacity_bytes and i < len(stream) - requests:  # warm up to full
        _request(cache, stream[i], buf[: len(stream[i])])
        i += 1
    before = cache.stats()
    match_ns, insert_ns, both_ns = [], [], []
    for tokens in stream[i : i + requests]:
        m, ins = _request(cache, tokens, buf[: len(tokens)])
        match_ns.append(m)
        insert_ns.append(ins)
        both_ns.append(m + ins)
    after = cache.stats()
    fixed_ns = [sum(_request(cache, t, buf[: len(t)])) for t in fixed]
    queried = after.query_tokens - before.query_tokens
    return {
        "match_us": _summary(match_ns),
        "insert_us": _summary(insert_ns),
        "match_insert_us": _summary(both_ns),
        "match_insert_2000_us": _summary(fixed_ns),
        "hit_rate": (after.hit_tokens - before.hit_tokens) / queried if queried else 0.0,
        "cached_tokens": after.cached_tokens,
        "nodes": after.nodes,
        "evictions": after.evictions - before.evictions,
        "warmup_requests": i,
        "mean_request_tokens": sum(map(len, stream[i : i + requests])) / max(requests, 1),
    }


def run_radix_bench(
    levels: Sequence[int] = (10_000, 100_000),
    *,
    requests: int = 2000,
    policies: Sequence[str] = ("lru", "gdsf"),
    bytes_per_token: int = 64,
    page_size: int = 1,
    num_prefixes: int = 64,
    zipf_s: float = 1.1,
    seed: int = 0,
) -> dict[str, Any]:
    """Replay a seeded stream at each cache size (in tokens) and policy; return the figures as a dict.

    `results[policy][str(level)]` holds match / insert / match+insert latency summaries (µs: median,
    p95, mean) over `requests` requests after the cache has filled, the same for 200 requests of
    exactly 2,000 tokens, and the token hit rate (hit / queried, queries capped at len-1).
    """
    import numpy as np  # numpy only here: the package stays numpy-free at import

    if bytes_per_token < 4 or bytes_per_token % 4:
        raise ValueError(f"bytes_per_token must be a positive multiple of 4, got {bytes_per_token}")
    warmup = max(levels) // 300 + 400  # enough requests to fill the largest level
    stream = make_stream(warmup + requests, num_prefixes=num_prefixes, zipf_s=zipf_s, seed=seed)
    rng = random.Random(seed + 1)
    fixed = [(t[:2000] + [rng.randrange(49_152) for _ in range(2000)])[:2000] for t in stream[:200]]
    rng.shuffle(fixed)
    longest = max(map(len, stream + fixed))
    buf = np.random.default_rng(seed).standard_normal((longest, bytes_per_token // 4), dtype=np.float32)
    results: dict[str, dict[str, Any]] = {}
    for policy in policies:
        results[policy] = {}
        for level in levels:
            gc.collect()  # start each run from the same heap state; gc stays on, as in production
            cache = RadixCache(level * bytes_per_token, page_size, policy=policy)
            results[policy][str(level)] = _bench_level(cache, stream, fixed, buf, requests)
    config = {
        "levels": list(levels),
        "requests": requests,
        "bytes_per_token": bytes_per_token,
        "page_size": page_size,
        "num_prefixes": num_prefixes,
        "zipf_s": zipf_s,
        "seed": seed,
        "prefix_len": [500, 2000],
        "suffix_len": [16, 256],
    }
    return {"config": config, "results": results}
