"""POST /v1/ask: a question answered from the document index (JSON, or server-sent events)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from rag.api.access import search_scope
from rag.api.bridge import SSE_HEADERS, ClosingStreamingResponse
from rag.api.deps import AccessDep, PrincipalDep, ServicesDep, SettingsDep
from rag.api.errors import ERROR_RESPONSES, ErrorResponse, api_error
from rag.api.generation import ANSWER, Generation
from rag.api.rag_stream import ask_frames
from rag.api.schemas.openai import new_id
from rag.api.schemas.rag import AskRequest, AskResponse
from rag.api.settings import Settings

router = APIRouter(
    prefix="/v1",
    tags=["rag"],
    responses={
        **ERROR_RESPONSES,
        404: {
            "model": ErrorResponse,
            "description": "`collections` names a collection not readable with this key",
        },
    },
)

_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "JSON, or with stream=true server-sent events: sources, delta..., usage, timings, done",
        "content": {"text/event-stream": {}},
    }
}


@router.post("/ask", response_model=AskResponse, responses=_SSE_DOC)
async def ask(
    body: AskRequest,
    request: Request,
    services: ServicesDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    access: AccessDep,
) -> Any:
    """Retrieve (only from the collections the caller may read, or the readable ones it names),
    rerank, answer. The tenant is the cache namespace; ``usage.cached_tokens`` says how much of the
    prompt came from the prefix cache (``usage.stitched_tokens``: from cached chunks, ``reuse='chunks'``)."""
    question, top_k = _validate(body, settings)
    scope = search_scope(access, body.collections)
    pipeline = services.ready_pipeline()
    params = pipeline.config.sampling_params(max_tokens=body.max_tokens)  # the pipeline's, one cap replaced
    namespace = principal.namespace()
    gen = await Generation.start(
        services,
        "ask",
        lambda: pipeline.stream(
            question, top_k, namespace, params=params, collections=scope, reuse=body.reuse
        ),
        ANSWER,
        param="question",
        peek=True,  # the sources: retrieval errors and a full queue get their status, not an SSE error
    )
    answer_id, model = new_id("ans"), pipeline.engine.model_id
    if body.stream:
        frames = ask_frames(gen, answer_id=answer_id, model=model)
        return ClosingStreamingResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)
    answer = await gen.collect(request)
    if answer is None:
        return Response(status_code=499)
    return AskResponse.of(answer, answer_id=answer_id, model=model)


def _validate(body: AskRequest, settings: Settings) -> tuple[str, int | None]:
    question = body.question.strip()
    if not question:
        raise api_error(422, "question is empty (only whitespace)", param="question", code="question_empty")
    if len(body.question) > settings.max_question_chars:
        raise api_error(
            422,
            f"question is too long: {len(body.question)} characters (at most {settings.max_question_chars})",
            param="question",
            code="question_too_long",
        )
    if "\x00" in question:
        raise api_error(422, "question contains a NUL character", param="question", code="invalid_characters")
    if body.top_k is not None and not 1 <= body.top_k <= settings.max_top_k:
        raise api_error(
            422,
            f"top_k must be between 1 and {settings.max_top_k}, got {body.top_k}",
            param="top_k",
            code="top_k_out_of_range",
        )
    too_large = settings.max_tokens_problem(body.max_tokens)
    if too_large:  # outside the bounds the schema publishes: FastAPI's 422
        raise api_error(422, too_large, param="max_tokens", code="max_tokens_too_large")
    return question, body.top_k
