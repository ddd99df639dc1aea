"""Prefix-cache routes: GET /v1/cache (stats, any tenant), POST /v1/cache/reset and POST /v1/cache/warm
(admin key only)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter

from rag.api.auth import Principal
from rag.api.deps import AdminDep, EngineDep, PrincipalDep, ServicesDep, SettingsDep
from rag.api.errors import ERROR_RESPONSES, api_error
from rag.api.openai_compat import chat_messages
from rag.api.schemas.cache import CacheWarmRequest

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
        "kv": stats.get("kv"),
        "disk": stats.get("disk"),
        "engine": {k: stats[k] for k in _ENGINE_FIELDS if k in stats},
        "in_flight": services.admission.in_flight,
    }


@router.post("/reset")
async def cache_reset(services: ServicesDep, admin: AdminDep, engine: EngineDep) -> dict[str, Any]:
    """Drop every cached prefix in RAM (all tenants). Counters are monotonic and survive the reset. The
    disk tier is left alone: other replicas may share its folder."""
    cache = getattr(engine, "cache", None)
    if cache is None or not hasattr(engine, "reset_cache"):
        raise api_error(400, "this server's engine has no local prefix cache to reset", code="no_local_cache")
    before = cache.used_bytes
    await anyio.to_thread.run_sync(engine.reset_cache, limiter=services.limiter)
    return {"object": "cache.reset", "freed_bytes": before, "used_bytes": cache.used_bytes}


@router.post("/warm")
async def cache_warm(
    body: CacheWarmRequest, services: ServicesDep, settings: SettingsDep, admin: AdminDep, engine: EngineDep
) -> dict[str, Any]:
    """Prefill prompts (system prompts, FAQ prompts) into a tenant's prefix cache and the disk tier,
    answering once their KV is written."""
    if not hasattr(engine, "warm"):
        raise api_error(400, "this server's engine has no local prefix cache to warm", code="no_local_cache")
    prompts: list[Any] = []
    for prompt in body.prompts:
        if isinstance(prompt, str):
            prompts.append(prompt)
        else:
            messages = chat_messages(prompt, settings)
            prompts.append(
                await anyio.to_thread.run_sync(services.chat_prompt, messages, limiter=services.limiter)
            )
    namespace = Principal(body.tenant).namespace()
    try:
        result = await anyio.to_thread.run_sync(
            lambda: engine.warm(prompts, namespace=namespace), limiter=services.limiter
        )
    except ValueError as exc:
        raise api_error(400, str(exc), param="prompts") from exc
    return {
        "object": "cache.warm",
        "tenant": body.tenant,
        "prompts": result.prompts,
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "disk_written": result.disk_written,
    }
