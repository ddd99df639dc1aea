"""Documents: POST /v1/documents (JSON or file upload), GET /v1/documents[/{id}], DELETE /v1/documents/{id},
and GET /v1/collections.

Every route works inside the caller's collections (``rag.api.access``): ``?collection=`` names one
(404 if the key may not read it, 403 on a write it may only read), else writes go to the caller's own
collection and reads cover every collection it may read. Ids are unique per collection. A document in
a collection the caller cannot read is answered exactly as an unknown id: the lookup only ever visits
the caller's own collections. Every change is durable in the document store (the index directory's
new version, or the database's committed transaction) before it is acknowledged, so an acknowledged
document survives a crash.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from pydantic import TypeAdapter, ValidationError

from rag.api.access import Access, require_readable, write_target
from rag.api.deps import AccessDep, ServicesDep, SettingsDep
from rag.api.documents_io import UploadError, documents_from_json, documents_from_upload, info_out
from rag.api.errors import ERROR_RESPONSES, ErrorResponse, api_error, format_loc
from rag.api.schemas.rag import (
    AddedDocuments,
    CollectionList,
    CollectionOut,
    DeletedDocument,
    DocumentIn,
    DocumentList,
    DocumentOut,
    DocumentsIn,
)
from rag.api.services import Services
from rag.api.settings import Settings
from rag.types import NAME_PATTERN

router = APIRouter(
    prefix="/v1",
    tags=["documents"],
    responses={
        **ERROR_RESPONSES,
        403: {"model": ErrorResponse, "description": "The collection is read-only for this key"},
        404: {
            "model": ErrorResponse,
            "description": "No such document, or no collection of that name readable with this key",
        },
        415: {"model": ErrorResponse, "description": "Unsupported file or content type"},
    },
)
CollectionQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=64,
        pattern=NAME_PATTERN,
        description="the collection to work in (default: writes go to the caller's own collection, "
        "reads cover every collection the caller may read)",
    ),
]

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


@router.post("/documents", status_code=201, response_model=AddedDocuments, openapi_extra=_UPLOAD_DOC)
async def add_documents(
    request: Request,
    services: ServicesDep,
    settings: SettingsDep,
    access: AccessDep,
    collection: CollectionQuery = None,
) -> AddedDocuments:
    """Add or update documents in a collection the caller may write: a JSON list of
    ``{id?, text, metadata?}`` (or ``{"documents": [...]}``), or a multipart upload of files (field
    ``file``; .txt, .md, .html, .pdf). An id already used in another collection is another document."""
    target = write_target(access, collection)
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
    ids = await _write(services, lambda: pipeline.add_documents(docs, collection=target))
    return AddedDocuments(ids=list(ids), count=len(ids), collection=target)


@router.get("/documents", response_model=DocumentList)
async def list_documents(
    services: ServicesDep, access: AccessDep, collection: CollectionQuery = None
) -> DocumentList:
    """The id, collection, metadata and size of every document in the caller's collections (or in
    the one named)."""
    pipeline = services.ready_pipeline()

    def infos() -> list[Any]:
        names = (
            [require_readable(access, collection)]
            if collection
            else access.readable_collections(pipeline.collections())
        )
        return list(pipeline.list_documents(names))

    return DocumentList(
        data=[info_out(i) for i in await anyio.to_thread.run_sync(infos, limiter=services.limiter)]
    )


@router.get("/documents/{doc_id:path}", response_model=DocumentOut)
async def get_document(
    doc_id: str, services: ServicesDep, access: AccessDep, collection: CollectionQuery = None
) -> DocumentOut:
    """One document, with its text: from the collection named, else the first of the caller's
    collections holding that id (its own collection first)."""
    pipeline = services.ready_pipeline()
    names = [require_readable(access, collection)] if collection else None
    found = await anyio.to_thread.run_sync(_find, pipeline, access, doc_id, names, limiter=services.limiter)
    if found is None:
        raise _not_found(doc_id)
    doc, where, n_chunks = found
    out = info_out(doc, where)
    out.chunks = n_chunks if out.chunks is None else out.chunks
    return out


@router.delete("/documents/{doc_id:path}", response_model=DeletedDocument)
async def delete_document(
    doc_id: str,
    services: ServicesDep,
    access: AccessDep,
    collection: CollectionQuery = None,
) -> DeletedDocument:
    """Remove a document and its chunks from a collection the caller may write (default: its own)."""
    target = write_target(access, collection)
    pipeline = services.ready_pipeline()
    deleted = await _write(services, lambda: pipeline.delete_document(doc_id, collection=target))
    if not deleted:
        raise _not_found(doc_id)
    return DeletedDocument(id=doc_id, collection=target)


@router.get("/collections", response_model=CollectionList, tags=["documents"])
async def list_collections(services: ServicesDep, access: AccessDep) -> CollectionList:
    """The collections the caller may read, its own first, with whether it may write them."""
    pipeline = services.ready_pipeline()

    def collections() -> list[CollectionOut]:
        names = access.readable_collections(pipeline.collections())
        return [
            CollectionOut(
                name=name,
                writable=access.can_write(name),
                home=name == access.home,
                documents=pipeline.count_documents([name]),
            )
            for name in names
        ]

    return CollectionList(data=await anyio.to_thread.run_sync(collections, limiter=services.limiter))


def _find(pipeline: Any, access: Access, doc_id: str, names: list[str] | None) -> tuple[Any, str, int] | None:
    """The document, its collection and its chunk count, searching ``names`` (default: the caller's
    readable collections, its own first); None when none of them holds ``doc_id``."""
    for name in names if names is not None else access.readable_collections(pipeline.collections()):
        doc = pipeline.get_document(doc_id, collection=name)
        if doc is not None:
            return doc, name, len(pipeline.chunks_of(doc_id, collection=name))
    return None


def _not_found(doc_id: str) -> Exception:
    """One answer for an unknown id and for an id held only by collections the caller cannot read."""
    return api_error(404, f"no document with id {doc_id!r}", param="id", code="document_not_found")


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


async def _write(services: Services, change: Any) -> Any:
    """Apply a change (durable in the store when it returns), one writer at a time, in a worker thread."""

    def run() -> Any:
        with services.write_lock:
            try:
                return change()
            except ValueError as exc:
                raise _Rejected(str(exc)) from exc

    try:
        return await anyio.to_thread.run_sync(run, limiter=services.limiter)
    except _Rejected as exc:
        raise api_error(422, str(exc), code="invalid_document") from exc


class _Rejected(Exception):
    """The pipeline refused the documents (its ValueError), as opposed to a server fault."""
