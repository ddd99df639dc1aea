"""The remote tier's settings: a Redis URL or a clear error naming what is allowed; no password in logs
or stats; PREFIXRAG_ENGINE__REMOTE_CACHE_URL reaches the served engine's config."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine import EngineConfig
from engine.tiers.redis_tier import safe_url
from rag.api import Settings


def test_a_redis_url_or_a_clear_error():
    assert (
        EngineConfig(remote_cache_url="redis://10.0.0.5:6379/2").remote_cache_url == "redis://10.0.0.5:6379/2"
    )
    assert (
        EngineConfig().remote_cache_url is None and EngineConfig(remote_cache_url="").remote_cache_url is None
    )
    for bad in ("http://cache:6379", "cache:6379", "redis"):
        with pytest.raises(ValidationError, match=r"redis://, rediss://, unix://"):
            EngineConfig(remote_cache_url=bad)
    with pytest.raises(ValidationError, match="remote_cache_timeout_s"):
        EngineConfig(remote_cache_timeout_s=0)


def test_the_password_never_shows():
    assert safe_url("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert safe_url("rediss://app:s3cret@cache/1") == "rediss://app:***@cache/1"
    assert safe_url("redis://cache:6379/0") == "redis://cache:6379/0"


def test_the_environment_sets_it(monkeypatch):
    monkeypatch.setenv("PREFIXRAG_ENGINE__REMOTE_CACHE_URL", "redis://127.0.0.1:6390/3")
    assert Settings().engine.remote_cache_url == "redis://127.0.0.1:6390/3"
