"""Documents: POST /v1/documents (JSON or file upload), GET /v1/documents[/{id}], DELETE /v1/documents/{id}.

Every change is saved to ``settings.index_dir`` (atomically, by the pipeline) before it is
acknowledged, so an acknowledged document survives a crash.
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request
from pydantic import TypeAdapter, ValidationError

from rag.api.deps import PrincipalDep, ServicesDep, SettingsDep
from rag.api.documents_io import UploadError, documents_from_json, documents_from_upload, info_out, persist
from rag.api.errors import ERROR_RESPONSES, ErrorResponse, api_error, format_loc
from rag.api.schemas.rag import (
    AddedDocuments,
    DeletedDocument,
    DocumentIn,
    DocumentList,
    DocumentOut,
    DocumentsIn,
)
from rag.api.services import Services
from rag.api.settings import Settings

router = APIRouter(
    prefix="/v1/documents",
    tags=["documents"],
    responses={
        **ERROR_RESPONSES,
        415: {"model": ErrorResponse, "description": "Unsupported file or content type"},
    },
)

_JSON_BODY = TypeAdapter(list[DocumentIn] | DocumentsIn)
_UPLOAD_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"type": "array", "items": {"$ref": "#/components/schemas/DocumentIn"}},
                        {"$ref": "#/components/schemas/DocumentsIn"},
                    ]
                }
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {"type": "array", "items": {"type": "string", "format": "binary"}}
                    },
                    "required": ["file"],
                }
            },
        },
    }
}


@router.post("", status_code=201, response_model=AddedDocuments, openapi_extra=_UPLOAD_DOC)
async def add_documents(
    request: Request, services: ServicesDep, settings: SettingsDep, principal: PrincipalDep
) -> AddedDocuments:
    """Add or update documents: a JSON list of ``{id?, text, metadata?}`` (or ``{"documents": [...]}``),
    or a multipart upload of files (field ``file``; .txt, .md, .html, .pdf)."""
    pipeline = services.ready_pipeline()
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        docs = await _from_upload(request, settings)
    elif content_type.startswith("application/json") or not content_type:
        docs = await _from_json(request, settings)
    else:
        raise api_error(
            415,
            f"unsupported content type {content_type!r}: send application/json or multipart/form-data",
            code="unsupported_media_type",
        )
    ids = await _write(services, settings, lambda: pipeline.add_documents(docs))
    return AddedDocuments(ids=list(ids), count=len(ids))


@router.get("", response_model=DocumentList)
async def list_documents(services: ServicesDep, principal: PrincipalDep) -> DocumentList:
    """Every stored document's id, metadata and size."""
    pipeline = services.ready_pipeline()
    infos = await anyio.to_thread.run_sync(pipeline.list_documents, limiter=services.limiter)
    return DocumentList(data=[info_out(i) for i in infos])


@router.get("/{doc_id:path}", response_model=DocumentOut)
async def get_document(doc_id: str, services: ServicesDep, principal: PrincipalDep) -> DocumentOut:
    """One document, with its text."""
    pipeline = services.ready_pipeline()
    doc = await anyio.to_thread.run_sync(pipeline.get_document, doc_id, limiter=services.limiter)
    if doc is None:
        raise api_error(404, f"no document with id {doc_id!r}", param="id", code="document_not_found")
    out = info_out(doc)
    chunks_of = getattr(pipeline, "chunks_of", None) or getattr(
        getattr(pipeline, "kb", None), "chunks_of", None
    )
    if out.chunks is None and callable(chunks_of):
        out.chunks = len(chunks_of(doc_id))
    return out


@router.delete("/{doc_id:path}", response_model=DeletedDocument)
async def delete_document(
    doc_id: str, services: ServicesDep, settings: SettingsDep, principal: PrincipalDep
) -> DeletedDocument:
    """Remove a document and its chunks from the index."""
    pipeline = services.ready_pipeline()
    deleted = await _write(services, settings, lambda: pipeline.delete_document(doc_id))
    if not deleted:
        raise api_error(404, f"no document with id {doc_id!r}", param="id", code="document_not_found")
    return DeletedDocument(id=doc_id)


async def _from_json(request: Request, settings: Settings) -> list[Any]:
    raw = await request.body()
    try:
        parsed = _JSON_BODY.validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first.get("type") == "json_invalid":
            raise api_error(400, "the request body is not valid JSON", code="invalid_json") from exc
        where = format_loc(first.get("loc", ()))
        raise api_error(
            422,
            f"expected a list of {{id?, text, metadata?}} or {{'documents': [...]}}: {where or 'body'}: {first.get('msg')}",
            param=where or None,
            code=str(first.get("type", "validation_error")),
        ) from exc
    items = parsed.documents if isinstance(parsed, DocumentsIn) else parsed
    if not items:
        raise api_error(422, "no documents given", param="documents", code="too_short")
    if len(items) > settings.max_documents_per_request:
        raise api_error(
            422,
            f"too many documents in one request: {len(items)} (at most {settings.max_documents_per_request})",
            code="too_many_documents",
        )
    try:
        return documents_from_json(items)
    except ValueError as exc:
        raise api_error(422, str(exc), code="invalid_document") from exc


async def _from_upload(request: Request, settings: Settings) -> list[Any]:
    form = await request.form(max_files=settings.max_documents_per_request)
    try:
        files = [f for key, f in form.multi_items() if key in ("file", "files") and not isinstance(f, str)]
        if not files:
            raise api_error(
                422, "no file in the upload (use the form field 'file')", param="file", code="missing"
            )
        try:
            return await anyio.to_thread.run_sync(documents_from_upload, files)
        except UploadError as exc:
            raise api_error(exc.status, str(exc), param="file", code=exc.code) from exc
    finally:
        await form.close()


async def _write(services: Services, settings: Settings, change: Any) -> Any:
    """Apply a change and save the index, one writer at a time, in a worker thread."""

    def run() -> Any:
        with services.write_lock:
            try:
                result = change()
            except ValueError as exc:
                raise _Rejected(str(exc)) from exc
            persist(services.pipeline, settings.index_dir)
            return result

    try:
        return await anyio.to_thread.run_sync(run, limiter=services.limiter)
    except _Rejected as exc:
        raise api_error(422, str(exc), code="invalid_document") from exc


class _Rejected(Exception):
    """The pipeline refused the documents (its ValueError), as opposed to a server fault."""
