"""GET /metrics: Prometheus text format (this app's own registry)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from rag.api.deps import ServicesDep
from rag.api.metrics import CONTENT_TYPE

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
async def metrics(services: ServicesDep) -> Response:
    """Requests by route and status, TTFT and latency histograms, prefix-cache tokens, bytes, evictions,
    queue depth."""
    return Response(services.metrics.render(), media_type=CONTENT_TYPE)
