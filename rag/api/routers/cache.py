"""Prefix-cache routes: GET /v1/cache (stats, any tenant), POST /v1/cache/reset (admin key only), and
/v1/cache/warm (POST starts prefilling every indexed chunk for the caller's namespace, GET reports,
DELETE cancels)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter

from rag.api.deps import AdminDep, EngineDep, PrincipalDep, ServicesDep
from rag.api.errors import ERROR_RESPONSES, api_error
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


@router.post("/warm", status_code=202)
async def cache_warm(services: ServicesDep, principal: PrincipalDep) -> dict[str, Any]:
    """Prefill every indexed chunk at its placement (stable prefix, ``[1]``, chunk) into the cache for
    the caller's namespace, in the background: chunks mode then reuses them on the first question too.
    Skips what is cached, stops adding once the cache budget is full (``report.not_fitted``)."""
    pipeline = services.ready_pipeline()
    running = services.warm_job
    if running is not None and running.running:
        raise api_error(409, "a warm-up is already running; GET /v1/cache/warm shows it", code="warm_running")
    job = WarmJob(pipeline, principal.namespace())
    services.warm_job = job
    job.start()
    return job.status()


@router.get("/warm")
async def cache_warm_status(services: ServicesDep, principal: PrincipalDep) -> dict[str, Any]:
    """Progress of the caller's warm-up (the admin sees any), its report once finished."""
    return _own_job(services, principal.namespace(), principal.admin).status()


@router.delete("/warm")
async def cache_warm_cancel(services: ServicesDep, principal: PrincipalDep) -> dict[str, Any]:
    """Cancel the caller's running warm-up (what was prefilled stays cached)."""
    job = _own_job(services, principal.namespace(), principal.admin)
    await anyio.to_thread.run_sync(job.stop, limiter=services.limiter)
    return job.status()


def _own_job(services: Any, namespace: str, admin: bool) -> WarmJob:
    job: WarmJob | None = services.warm_job
    if job is None or not (admin or job.namespace == namespace):
        raise api_error(404, "no warm-up was started for this namespace", code="no_warm_job")
    return job
