"""Documents: POST /v1/documents (JSON or file upload), GET /v1/documents[/{id}], DELETE /v1/documents/{id}."""

from __future__ import annotations

from fastapi import APIRouter

from rag.api.errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/documents", tags=["documents"], responses=ERROR_RESPONSES)
