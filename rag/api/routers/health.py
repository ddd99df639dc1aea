"""Liveness and readiness: /healthz (and /health, what the SGLang router probes) and /readyz."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from rag.api.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
@router.get("/health", include_in_schema=False)
async def healthz() -> dict[str, str]:
    """Always 200 while the process serves HTTP (the model may still be loading)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={503: {"description": "Still loading, or loading failed", "content": {"application/json": {}}}},
)
async def readyz(services: ServicesDep) -> Any:
    """200 once the model (and the document pipeline, if configured) is loaded; 503 before, or on failure."""
    state = services.state
    body: dict[str, Any] = {"status": state, "model": services.model_names()[0] if state == "ready" else None}
    if state == "failed":
        body["error"] = services.error
    if state != "ready":
        return JSONResponse(body, status_code=503)
    body["pipeline"] = services.pipeline is not None
    return body
