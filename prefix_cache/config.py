"""CacheConfig: the prefix_cache package's settings, validated by pydantic."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from prefix_cache.eviction import DEFAULT_ATTENTION_WINDOW


class CacheConfig(BaseModel):
    """Settings for a `RadixCache`; `RadixCache.from_config(config)` builds one.

    Example:
        >>> from prefix_cache import CacheConfig, RadixCache
        >>> cache = RadixCache.from_config(CacheConfig(capacity_bytes=2**30, eviction="gdsf"))
        >>> cache.capacity_bytes, cache.page_size
        (1073741824, 1)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    capacity_bytes: int = Field(ge=0, description="byte budget for stored values")
    page_size: int = Field(default=1, ge=1, description="tokens per page; match and insert whole pages")
    eviction: Literal["lru", "gdsf"] = Field(default="lru", description="eviction policy name")
    attention_window: float = Field(
        default=DEFAULT_ATTENTION_WINDOW,
        gt=0,
        description="gdsf only: position where attention cost equals matmul cost",
    )
