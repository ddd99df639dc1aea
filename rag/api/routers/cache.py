"""Prefix-cache routes: GET /v1/cache (stats, any tenant), POST /v1/cache/reset and POST /v1/cache/warm
(admin key only: prompts into a tenant's cache and the disk tier), and /v1/cache/warm/chunks (POST starts
prefilling every indexed chunk for the caller's namespace, GET reports, DELETE cancels)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter

from engine.backend import local_cache
from engine.tiers.stats import TIER_NAMES
from rag.api.access import search_scope
from rag.api.auth import Principal
from rag.api.deps import AccessDep, AdminDep, EngineDep, PrincipalDep, ServicesDep, SettingsDep
from rag.api.errors import ERROR_RESPONSES, api_error
from rag.api.openai_compat import chat_messages
from rag.api.schemas.cache import CacheWarmRequest
from rag.api.warm_job import WarmJob

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
    "stitched_requests",
    "stitched_tokens",
    "recomputed_tokens",
    "chunk_prefill_tokens",
)


@router.get("")
async def cache_stats(services: ServicesDep, principal: PrincipalDep, engine: EngineDep) -> dict[str, Any]:
    """The prefix cache's counters (hit rate, bytes, evictions) and the engine's queue, server-wide."""
    stats = engine.stats()
    return {
        "object": "cache.stats",
        "model": engine.model_id,
        "caching": bool(stats.get("caching", True)),
        "exact_reuse": stats.get("exact_reuse"),
        "exact_reuse_reason": stats.get("exact_reuse_reason"),
        "cache": stats.get("cache", {}),
        "kv": stats.get("kv"),
        **{name: stats.get(name) for name in TIER_NAMES},  # "disk", "remote": a tier's figures or None
        "engine": {k: stats[k] for k in _ENGINE_FIELDS if k in stats},
        "in_flight": services.admission.in_flight,
    }


@router.post("/reset")
async def cache_reset(services: ServicesDep, admin: AdminDep, engine: EngineDep) -> dict[str, Any]:
    """Drop every cached prefix in RAM (all tenants). Counters are monotonic and survive the reset. The
    disk tier is left alone: other replicas may share its folder."""
    local = local_cache(engine)
    if local is None:
        raise api_error(400, "this server's engine has no local prefix cache to reset", code="no_local_cache")
    before = local.cache.used_bytes
    await anyio.to_thread.run_sync(local.reset_cache, limiter=services.limiter)
    return {"object": "cache.reset", "freed_bytes": before, "used_bytes": local.cache.used_bytes}


@router.post("/warm")
async def cache_warm(
    body: CacheWarmRequest, services: ServicesDep, settings: SettingsDep, admin: AdminDep, engine: EngineDep
) -> dict[str, Any]:
    """Prefill prompts (system prompts, FAQ prompts) into a tenant's prefix cache and the disk tier,
    answering once their KV is written."""
    local = local_cache(engine)
    if local is None:
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
            lambda: local.warm(prompts, namespace=namespace), limiter=services.limiter
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


@router.post("/warm/chunks", status_code=202)
async def cache_warm_chunks(
    services: ServicesDep, principal: PrincipalDep, access: AccessDep
) -> dict[str, Any]:
    """Prefill every chunk the caller may read at its placements (stable prefix, ``[1]``, chunk; and the
    same after the stand-in passage and ``[2]``, ``rag.warming``) into the cache for the caller's namespace, in the background: chunks mode then reuses them on the first question too.
    Skips what is cached, stops adding once the cache budget is full (``report.not_fitted``)."""
    pipeline = services.ready_pipeline()
    running = services.warm_job
    if running is not None and running.running:
        raise api_error(
            409, "a warm-up is already running; GET /v1/cache/warm/chunks shows it", code="warm_running"
        )
    job = WarmJob(pipeline, principal.namespace(), search_scope(access, None))
    services.warm_job = job
    job.start()
    return job.status()


@router.get("/warm/chunks")
async def cache_warm_chunks_status(services: ServicesDep, principal: PrincipalDep) -> dict[str, Any]:
    """Progress of the caller's warm-up (the admin sees any), its report once finished."""
    return _own_job(services, principal.namespace(), principal.admin).status()


@router.delete("/warm/chunks")
async def cache_warm_chunks_cancel(services: ServicesDep, principal: PrincipalDep) -> dict[str, Any]:
    """Cancel the caller's running warm-up (what was prefilled stays cached)."""
    job = _own_job(services, principal.namespace(), principal.admin)
    await anyio.to_thread.run_sync(job.stop, limiter=services.limiter)
    return job.status()


def _own_job(services: Any, namespace: str, admin: bool) -> WarmJob:
    job: WarmJob | None = services.warm_job
    if job is None or not (admin or job.namespace == namespace):
        raise api_error(404, "no warm-up was started for this namespace", code="no_warm_job")
    return job
