"""Prefix-cache routes: GET /v1/cache (stats, any tenant) and POST /v1/cache/reset (admin key only)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter

from rag.api.deps import AdminDep, EngineDep, PrincipalDep, ServicesDep
from rag.api.errors import ERROR_RESPONSES, api_error

router = APIRouter(prefix="/v1/cache", tags=["cache"], responses=ERROR_RESPONSES)

_ENGINE_FIELDS = (
    "waiting",
    "running",
    "requests",
    "finished",
    "failed",
    "cancelled",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
)


@router.get("")
async def cache_stats(services: ServicesDep, principal: PrincipalDep, engine: EngineDep) -> dict[str, Any]:
    """The prefix cache's counters (hit rate, bytes, evictions) and the engine's queue, server-wide."""
    stats = engine.stats()
    return {
        "object": "cache.stats",
        "model": engine.model_id,
        "caching": bool(stats.get("caching", True)),
        "cache": stats.get("cache", {}),
        "engine": {k: stats[k] for k in _ENGINE_FIELDS if k in stats},
        "in_flight": services.admission.in_flight,
    }


@router.post("/reset")
async def cache_reset(services: ServicesDep, admin: AdminDep, engine: EngineDep) -> dict[str, Any]:
    """Drop every cached prefix (all tenants). Counters are monotonic and survive the reset."""
    cache = getattr(engine, "cache", None)
    if cache is None or not hasattr(engine, "reset_cache"):
        raise api_error(400, "this server's engine has no local prefix cache to reset", code="no_local_cache")
    before = cache.used_bytes
    await anyio.to_thread.run_sync(engine.reset_cache, limiter=services.limiter)
    return {"object": "cache.reset", "freed_bytes": before, "used_bytes": cache.used_bytes}
