"""What a load balancer asks a worker when it registers it: SGLang's model and server info routes.

sglang-router (0.3) registers a worker by probing ``GET /health``, then ``/server_info`` (falling back
to ``/get_server_info``) and ``/model_info`` (falling back to ``/get_model_info``). It names the
worker's model after ``served_model_name`` (so the router's ``/v1/models`` lists the real id instead of
``unknown``). ``model_path`` and ``tokenizer_path`` are left out on purpose: given either, the router
tries to load that tokenizer itself, downloading it from the Hugging Face hub when the value is a
registry name such as ``smollm2-135m-instruct``; its HTTP routing does not need one.

No key is needed (like ``/health``): these say which model is served and the server's limits, nothing
about any tenant.
"""

from __future__ import annotations

from typing import Any

import torch
from fastapi import APIRouter

from engine.backend import GenerationBackend, local_cache
from rag.api.deps import ServicesDep
from rag.api.services import Services
from rag.api.version import package_version
from rag.openmp import wait_settings

router = APIRouter(tags=["worker"], include_in_schema=False)


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(services: ServicesDep) -> dict[str, Any]:
    """The served model (SGLang's ``/get_model_info`` fields that apply here)."""
    engine = services.engine
    info: dict[str, Any] = {
        "served_model_name": _model_id(services),
        "is_generation": True,
        "model_type": "causal_lm",
    }
    if engine is not None and engine.max_context:
        info["max_context_length"] = engine.max_context
    return info


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(services: ServicesDep) -> dict[str, Any]:
    """Server limits and state (SGLang's ``/get_server_info`` names where one applies).

    ``prefix_caching`` is what the loaded engine decided (it turns caching off for models whose KV
    cannot be reused exactly, whatever the settings ask), null while the model loads, false for a
    remote engine (no cache in this process); ``exact_reuse`` (and its reason) whether reused KV gives
    the same bits as computing it on this machine (engine.exact_reuse), null while loading, for a
    remote engine, or with caching off; ``dtype`` the dtype the engine computes in and why, null while
    loading; ``threads`` torch's thread count and how its OpenMP threads wait (``prefixrag serve`` bounds
    their spin: rag.openmp).
    """
    settings = services.settings
    engine = services.engine
    stats = engine.stats() if engine is not None else {}
    return {
        "served_model_name": _model_id(services),
        "version": package_version(),
        "state": services.state,
        "dp_size": 1,
        "max_running_requests": settings.max_inflight,
        "prefix_caching": None if engine is None else _caches(engine),
        "cache_bytes": settings.engine.cache_bytes,
        "dtype": stats.get("dtype"),  # the compute dtype and why ("auto" resolves per CPU)
        "threads": {"torch": torch.get_num_threads(), **wait_settings()},
        "exact_reuse": stats.get("exact_reuse"),
        "exact_reuse_reason": stats.get("exact_reuse_reason"),
    }


def _caches(engine: GenerationBackend) -> bool:
    cache = local_cache(engine)
    return cache is not None and cache.caching


def _model_id(services: Services) -> str:
    names = services.model_names()
    return names[0] if names else services.settings.engine.model
