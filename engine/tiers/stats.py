"""The figures every KV tier reports, named once: each tier's ``stats()`` dict has these keys, and
``Engine.stats()``, GET /v1/cache and /metrics (``prefixrag_kv_<tier>_<metric>``) read this table.

Example:
    >>> counters = TierCounters()
    >>> counters.add(lookups=1, hit_tokens=64)
    >>> counters.snapshot()["hit_tokens"], [s.key for s in TIER_STATS][:2]
    (64, ['lookups', 'hit_requests'])
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

TIER_NAMES = ("disk", "remote")  # top to bottom, under the RAM prefix cache


@dataclass(frozen=True)
class TierStat:
    """One figure: its key in ``stats()``, its Prometheus name after ``prefixrag_kv_<tier>_`` (None: only
    in the tier-labelled hit family), and what it counts (``{tier}``: the tier's name)."""

    key: str
    metric: str | None
    kind: Literal["counter", "gauge"]
    help: str


TIER_STATS: tuple[TierStat, ...] = (
    TierStat(
        "lookups", "lookups", "counter", "Requests that asked the {tier} tier for KV after the tiers above"
    ),
    TierStat("hit_requests", "hit_requests", "counter", "Requests that got KV from the {tier} tier"),
    TierStat("hit_tokens", None, "counter", "Prompt tokens whose KV came from the {tier} tier"),
    TierStat("read_blocks", "read_blocks", "counter", "KV blocks read from the {tier} tier"),
    TierStat("read_bytes", "read_bytes", "counter", "Bytes of KV read from the {tier} tier"),
    TierStat("read_s", "read_seconds", "counter", "Seconds spent reading (and checking) {tier} KV blocks"),
    TierStat("written_blocks", "written_blocks", "counter", "KV blocks written to the {tier} tier"),
    TierStat("written_bytes", "written_bytes", "counter", "Bytes of KV written to the {tier} tier"),
    TierStat("write_s", "write_seconds", "counter", "Seconds the {tier} tier's writer spent writing blocks"),
    TierStat("write_cpu_s", "write_cpu_seconds", "counter", "CPU seconds of the {tier} tier's writer"),
    TierStat(
        "rejected", "rejected_blocks", "counter", "Damaged or foreign {tier} KV records (misses, deleted)"
    ),
    TierStat("write_errors", "write_errors", "counter", "{tier} KV blocks that could not be written"),
    TierStat(
        "write_dropped",
        "write_dropped",
        "counter",
        "Prefixes not written to the {tier} tier (queue or budget)",
    ),
    TierStat(
        "unavailable",
        "unavailable_calls",
        "counter",
        "{tier} tier calls skipped or failed: the store was unreachable",
    ),
    TierStat("evictions", "evictions", "counter", "{tier} KV records evicted to stay within the budget"),
    # a store that does not report a figure gives None: /v1/cache shows null, /metrics leaves it out
    TierStat("evicted_bytes", "evicted_bytes", "counter", "Bytes of {tier} KV records evicted"),
    TierStat("used_bytes", "used_bytes", "gauge", "Bytes the {tier} tier's store holds"),
    TierStat("capacity_bytes", "capacity_bytes", "gauge", "The {tier} tier's byte budget (0: none set)"),
    TierStat("queue_depth", "queue_depth", "gauge", "Prefixes waiting for the {tier} tier's writer"),
    TierStat(
        "available", "available", "gauge", "1 while the {tier} tier's store answers, 0 while it is skipped"
    ),
    TierStat("outages", "outages", "counter", "Times the {tier} tier's store stopped answering"),
)

# counted by the tier's read and write paths; the store reports the rest
POLICY_COUNTERS = (
    "lookups",
    "hit_requests",
    "hit_tokens",
    "read_blocks",
    "read_bytes",
    "read_s",
    "written_blocks",
    "written_bytes",
    "write_s",
    "write_cpu_s",
    "rejected",
    "write_errors",
    "write_dropped",
    "unavailable",
)
STORE_STATS = ("evictions", "evicted_bytes", "used_bytes", "capacity_bytes", "available", "outages")


class TierCounters:
    """Thread-safe running totals of ``POLICY_COUNTERS`` (readers, the writer and the engine add)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = dict.fromkeys(POLICY_COUNTERS, 0)

    def add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._values)
