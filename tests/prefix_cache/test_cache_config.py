"""CacheConfig: validation and building a cache from it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefix_cache import CacheConfig, GDSFPolicy, LRUPolicy, RadixCache


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_bytes": -1},
        {"capacity_bytes": 10, "page_size": 0},
        {"capacity_bytes": 10, "eviction": "fifo"},
        {"capacity_bytes": 10, "attention_window": 0},
        {"capacity_bytes": 10, "colour": "red"},
        {},
    ],
)
def test_invalid_configs_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValidationError):
        CacheConfig(**kwargs)


def test_defaults_and_from_config() -> None:
    cfg = CacheConfig(capacity_bytes=1000)
    assert (cfg.page_size, cfg.eviction) == (1, "lru")
    assert isinstance(RadixCache.from_config(cfg).policy, LRUPolicy)
    gdsf = RadixCache.from_config(
        CacheConfig(capacity_bytes=1000, page_size=4, eviction="gdsf", attention_window=99)
    )
    assert isinstance(gdsf.policy, GDSFPolicy) and gdsf.policy.attention_window == 99
    assert (gdsf.capacity_bytes, gdsf.page_size) == (1000, 4)


def test_config_round_trips_through_json() -> None:
    cfg = CacheConfig(capacity_bytes=2**30, page_size=16, eviction="gdsf")
    assert CacheConfig.model_validate_json(cfg.model_dump_json()) == cfg
