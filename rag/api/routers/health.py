"""Liveness and readiness: /healthz (liveness), /readyz and /health (readiness).

``/health`` is what a load balancer probes (sglang-router's default health path; SGLang's own
``/health`` answers once the model is loaded), so it follows readiness: 503 while the model loads or
after loading failed, so no traffic is sent to a replica that cannot serve it. ``/healthz`` stays 200
while the process serves HTTP (a restart probe must not kill a replica that is still loading).
A document store that stops answering does not make a replica unready: it answers questions from the
documents it holds, ``/readyz``'s ``store`` says the store is unreachable, and writes get 503.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from rag.api.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Always 200 while the process serves HTTP (the model may still be loading)."""
    return {"status": "ok"}


@router.get("/health", include_in_schema=False)
async def health(services: ServicesDep) -> Any:
    """For load balancers: 200 ``{"status": "ok"}`` once the engine can serve, else 503 with the state."""
    if services.state == "ready":
        return {"status": "ok"}
    return JSONResponse({"status": services.state}, status_code=503)


@router.get(
    "/readyz",
    responses={503: {"description": "Still loading, or loading failed", "content": {"application/json": {}}}},
)
async def readyz(services: ServicesDep) -> Any:
    """200 once the model (and the document pipeline, if configured) is loaded; 503 before, or on
    failure. ``store``: the document store's backend, location (no password), whether it answers
    (``reachable``), the change-log position this replica has followed to, and the error if any."""
    state = services.state
    body: dict[str, Any] = {"status": state, "model": services.model_names()[0] if state == "ready" else None}
    if state == "failed":
        body["error"] = services.error
    if state != "ready":
        return JSONResponse(body, status_code=503)
    body["pipeline"] = services.pipeline is not None
    store = services.store_status()
    if store is not None:
        body["store"] = store
    return body
