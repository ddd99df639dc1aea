"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models (the engine, prefix-cached)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from engine.request import GenerationResult
from rag.api.access import search_scope
from rag.api.bridge import SSE_HEADERS, ClosingStreamingResponse
from rag.api.chat_retrieval import GroundedChat
from rag.api.deps import AccessDep, EngineDep, PrincipalDep, ServicesDep, SettingsDep
from rag.api.errors import ERROR_RESPONSES, ErrorResponse, api_error
from rag.api.generation import ENGINE, Generation
from rag.api.openai_compat import (
    chat_messages,
    check_chat,
    check_completion,
    completion_prompt,
    sampling_params,
)
from rag.api.schemas.openai import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
    finish_reason,
    new_id,
    now,
)
from rag.api.schemas.rag import SourceOut
from rag.api.services import Services
from rag.api.sse import chat_frames, completion_frames, guarded, openai_error_frames

router = APIRouter(
    prefix="/v1",
    tags=["openai"],
    responses={
        **ERROR_RESPONSES,
        404: {
            "model": ErrorResponse,
            "description": "Unknown model, or `collections` names a collection not readable with this key",
        },
    },
)

_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {"description": "JSON, or server-sent events with stream=true", "content": {"text/event-stream": {}}}
}
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@router.post("/chat/completions", response_model=ChatCompletion, responses=_SSE_DOC)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    services: ServicesDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    access: AccessDep,
    engine: EngineDep,
) -> Any:
    """Chat completion over the prefix-cached engine; ``usage.prompt_tokens_details.cached_tokens``
    says how much of the prompt was reused. With ``rag`` (or ``collections``) the reply is grounded
    on passages retrieved from the caller's readable collections (``sources``)."""
    model = _check_model(services, body.model)
    check_chat(body)
    params = sampling_params(
        body,
        settings,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        default_max_tokens=settings.default_max_tokens,
        also_checked=body.max_tokens,  # refused even where max_completion_tokens overrides it
    )
    messages = chat_messages(body.messages, settings)
    namespace = principal.namespace(body.cache_salt)
    sources = None
    if body.rag or body.collections is not None:  # grounded by the pipeline, as /v1/ask is
        scope = search_scope(access, body.collections)
        grounded = GroundedChat(services.ready_pipeline(), messages, params, namespace=namespace, scope=scope)
        gen = await Generation.start(services, "chat", grounded, ENGINE, param="messages")
        sources = grounded.sources
    else:  # tokenized in the worker thread that opens the stream: one hand-off, not two
        gen = await Generation.start(
            services,
            "chat",
            lambda: engine.stream(services.chat_prompt(messages), params, namespace=namespace),
            ENGINE,
            param="messages",
        )
    frames = functools.partial(chat_frames, sources=sources)
    body_of = functools.partial(_chat_completion, sources=sources)
    return await _reply(gen, request, body, _Reply("chatcmpl", model, frames, body_of))


@router.post("/completions", response_model=Completion, responses=_SSE_DOC)
async def completions(
    body: CompletionRequest,
    request: Request,
    services: ServicesDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    engine: EngineDep,
) -> Any:
    """Text completion; ``prompt`` may be a string or token ids (one prompt per request)."""
    model = _check_model(services, body.model)
    check_completion(body)
    default = min(_COMPLETIONS_DEFAULT_MAX_TOKENS, settings.max_tokens_limit)
    params = sampling_params(body, settings, max_tokens=body.max_tokens, default_max_tokens=default)
    prompt = completion_prompt(body)
    namespace = principal.namespace(body.cache_salt)
    gen = await Generation.start(
        services,
        "completions",
        lambda: engine.stream(prompt, params, namespace=namespace),
        ENGINE,
        param="prompt",
    )
    return await _reply(gen, request, body, _Reply("cmpl", model, completion_frames, _completion))


@router.get("/models", response_model=ModelList)
async def list_models(services: ServicesDep, principal: PrincipalDep, engine: EngineDep) -> ModelList:
    created = services.started_at
    return ModelList(data=[ModelCard(id=name, created=created) for name in services.model_names()])


@router.get("/models/{model_id:path}", response_model=ModelCard)
async def get_model(
    model_id: str, services: ServicesDep, principal: PrincipalDep, engine: EngineDep
) -> ModelCard:
    if model_id not in services.model_names():
        raise api_error(404, f"the model {model_id!r} does not exist", param="model", code="model_not_found")
    return ModelCard(id=model_id, created=services.started_at)


def _check_model(services: Services, requested: str | None) -> str:
    """The engine's model id; a request naming another model gets 404, as OpenAI answers."""
    names = services.model_names()
    if requested is not None and requested not in names:
        raise api_error(
            404,
            f"the model {requested!r} does not exist; this server serves {', '.join(map(repr, names))}",
            param="model",
            code="model_not_found",
        )
    return names[0]


@dataclass(frozen=True)
class _Reply:
    """How one route answers: its id prefix, the served model, its SSE frames and its JSON body."""

    id_prefix: str
    model: str
    frames: Callable[..., AsyncIterator[str]]
    body: Callable[[str, int, str, GenerationResult], BaseModel]


async def _reply(
    gen: Generation, request: Request, body: ChatCompletionRequest | CompletionRequest, reply: _Reply
) -> Any:
    """Server-sent events with ``stream: true``, else the whole result (499 if the client left first)."""
    cid, created = new_id(reply.id_prefix), now()
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        frames = reply.frames(
            gen, chunk_id=cid, created=created, model=reply.model, include_usage=include_usage
        )
        return ClosingStreamingResponse(
            guarded(frames, gen, openai_error_frames), media_type="text/event-stream", headers=SSE_HEADERS
        )
    result = await gen.collect(request)
    if result is None:
        return Response(status_code=499)
    return reply.body(cid, created, reply.model, result)


def _chat_completion(
    cid: str, created: int, model: str, r: GenerationResult, *, sources: list[SourceOut] | None = None
) -> ChatCompletion:
    message = AssistantMessage(content=r.text)
    return ChatCompletion(
        id=cid,
        created=created,
        model=model,
        choices=[ChatChoice(message=message, finish_reason=finish_reason(r.finish_reason))],
        usage=Usage.of_result(r),
        sources=sources,
    )


def _completion(cid: str, created: int, model: str, r: GenerationResult) -> Completion:
    return Completion(
        id=cid,
        created=created,
        model=model,
        choices=[CompletionChoice(text=r.text, finish_reason=finish_reason(r.finish_reason))],
        usage=Usage.of_result(r),
    )
