"""Prometheus metrics, one registry per app (tests build several apps in one process).

HTTP traffic is counted by ``MetricsMiddleware``; generation latencies and token counts by
``Metrics.observe_generation``; the engine's and the prefix cache's own counters are read at scrape
time by ``EngineCollector`` (so they are exact, and nothing polls).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.tiers.stats import TIER_NAMES, TIER_STATS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class Metrics:
    """The app's metrics. ``render()`` is the /metrics body.

    Example:
        >>> m = Metrics()
        >>> m.observe_generation("chat", ttft_s=0.2, total_s=1.0, prompt_tokens=40, cached_tokens=32,
        ...                      completion_tokens=8)
        >>> b"prefixrag_time_to_first_token_seconds_count" in m.render()
        True
    """

    def __init__(self, engine_stats: Callable[[], dict[str, Any] | None] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "prefixrag_http_requests",
            "HTTP requests by route and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "prefixrag_http_request_duration_seconds",
            "HTTP request duration (to the last byte of a stream)",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "prefixrag_time_to_first_token_seconds",
            "Time to first token, queue wait included",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "prefixrag_e2e_request_latency_seconds",
            "Generation latency, submission to last token",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "prefixrag_prompt_tokens", "Prompt tokens served", ["endpoint"], registry=r
        )
        self.cached_tokens = Counter(
            "prefixrag_cached_prompt_tokens",
            "Prompt tokens read from the prefix cache",
            ["endpoint"],
            registry=r,
        )
        self.stitched_tokens = Counter(
            "prefixrag_stitched_prompt_tokens",
            "Prompt tokens whose KV came from cached chunks at other positions (reuse mode 'chunks')",
            ["endpoint"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "prefixrag_generation_tokens", "Completion tokens generated", ["endpoint"], registry=r
        )
        self.in_flight = Gauge(
            "prefixrag_api_requests_in_flight", "Generations admitted by the API", registry=r
        )
        self.disconnects = Counter(
            "prefixrag_client_disconnects",
            "Generations cancelled because the client went away",
            ["endpoint"],
            registry=r,
        )
        if engine_stats is not None:
            r.register(EngineCollector(engine_stats))

    def observe_generation(
        self,
        endpoint: str,
        *,
        ttft_s: float,
        total_s: float,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        stitched_tokens: int = 0,
    ) -> None:
        self.ttft.labels(endpoint).observe(ttft_s)
        self.e2e.labels(endpoint).observe(total_s)
        self.prompt_tokens.labels(endpoint).inc(prompt_tokens)
        self.cached_tokens.labels(endpoint).inc(cached_tokens)
        self.stitched_tokens.labels(endpoint).inc(stitched_tokens)
        self.completion_tokens.labels(endpoint).inc(completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class EngineCollector:
    """Engine queue and prefix-cache figures, read from ``engine.stats()`` at each scrape."""

    def __init__(self, engine_stats: Callable[[], dict[str, Any] | None]) -> None:
        self._stats = engine_stats

    def describe(self) -> Iterable[Metric]:
        return []  # names vary with readiness; skip auto-describe

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        ready = GaugeMetricFamily("prefixrag_model_ready", "1 once the model is loaded")
        ready.add_metric([], 1.0 if stats is not None else 0.0)
        yield ready
        if stats is None:
            return
        cache = stats.get("cache", {})
        for name, key, doc in (
            ("prefixrag_prefix_cache_queries", "query_tokens", "Prompt tokens looked up in the prefix cache"),
            ("prefixrag_prefix_cache_hits", "hit_tokens", "Prompt tokens found in the prefix cache"),
            ("prefixrag_prefix_cache_evictions", "evictions", "Prefix-cache nodes evicted"),
            ("prefixrag_prefix_cache_evicted_bytes", "evicted_bytes", "Prefix-cache bytes evicted"),
        ):
            yield _counter(name, doc, cache.get(key, 0))
        for name, key, doc in (
            ("prefixrag_prefix_cache_used_bytes", "used_bytes", "Bytes of KV held by the prefix cache"),
            ("prefixrag_prefix_cache_capacity_bytes", "capacity_bytes", "Prefix-cache byte budget"),
            (
                "prefixrag_prefix_cache_protected_bytes",
                "protected_bytes",
                "Cache bytes locked by running requests",
            ),
            ("prefixrag_prefix_cache_nodes", "nodes", "Radix-tree nodes"),
            ("prefixrag_prefix_cache_hit_rate", "hit_rate", "Token-weighted hit rate since start"),
        ):
            yield _gauge(name, doc, cache.get(key, 0))
        yield _gauge(
            "prefixrag_engine_queue_depth", "Requests waiting in the engine queue", stats.get("waiting", 0)
        )
        yield _gauge("prefixrag_engine_running", "Requests the engine is decoding", stats.get("running", 0))
        slabs = stats.get("kv_slabs") or {}
        yield _gauge(
            "prefixrag_kv_slab_bytes",
            "Memory held for the prefix cache's KV blocks (used and free slots)",
            slabs.get("slab_bytes", 0),
        )
        yield from _kv_tier_metrics(stats)
        for name, key, doc in (
            (
                "prefixrag_chunk_reuse_requests",
                "stitched_requests",
                "Requests served by stitching cached chunks",
            ),
            (
                "prefixrag_chunk_reuse_stitched_tokens",
                "stitched_tokens",
                "Chunk tokens reused at a new position",
            ),
            (
                "prefixrag_chunk_reuse_recomputed_tokens",
                "recomputed_tokens",
                "Reused chunk tokens recomputed over the stitched context",
            ),
            (
                "prefixrag_chunk_reuse_prefilled_tokens",
                "chunk_prefill_tokens",
                "Tokens prefilled at chunks' canonical placements (then cached)",
            ),
        ):
            yield _counter(name, doc, stats.get(key, 0))
        outcomes = CounterMetricFamily(
            "prefixrag_engine_requests", "Engine requests by outcome", labels=["outcome"]
        )
        for outcome in ("finished", "failed", "cancelled"):
            outcomes.add_metric([outcome], float(stats.get(outcome, 0)))
        yield outcomes


def _kv_tier_metrics(stats: dict[str, Any]) -> Iterable[Metric]:
    """KV storage format and per-tier figures: RAM (the prefix cache) and each tier under it that is on
    (``prefixrag_kv_<tier>_<metric>``, named in engine.tiers.stats)."""
    kv = stats.get("kv") or {}
    yield _gauge(
        "prefixrag_kv_bytes_per_token",
        "Bytes one token's KV takes in the cache",
        kv.get("bytes_per_token", 0),
    )
    tiers = {name: stats.get(name) or {} for name in TIER_NAMES}
    hits = CounterMetricFamily(
        "prefixrag_kv_tier_hit_tokens", "Prompt tokens whose KV came from each cache tier", labels=["tier"]
    )
    hits.add_metric(["ram"], float(stats.get("cache", {}).get("hit_tokens", 0)))
    for name, tier in tiers.items():
        hits.add_metric([name], float(tier.get("hit_tokens", 0)))
    yield hits
    for name, tier in tiers.items():
        if not tier:
            continue
        for stat in TIER_STATS:
            if stat.metric is None:
                continue
            value = tier.get(stat.key)
            if value is None:  # a figure this tier's store does not report
                continue
            metric, doc = f"prefixrag_kv_{name}_{stat.metric}", stat.help.format(tier=name)
            make = _counter if stat.kind == "counter" else _gauge
            yield make(metric, doc, value)


class MetricsMiddleware:
    """Counts every HTTP request by route template (not raw path: bounded label values) and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            if scope.get("prefixrag.client_gone"):
                status = 499  # nginx's "client closed request"
            self.metrics.requests.labels(label, scope.get("method", ""), str(status)).inc()
            self.metrics.request_seconds.labels(label).observe(time.perf_counter() - start)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc)
    family.add_metric([], float(value))
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], float(value))
    return family
