"""The OpenAPI schema as clients (and schema-driven fuzzers) should see it: this server's limits filled in
(question length, top_k, max_tokens come from the settings), the documents body's models included,
and which methods each path allows (for 405 answers)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import compile_path

from rag.api.schemas.rag import DocumentIn, DocumentsIn
from rag.api.settings import Settings


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Replace ``app.openapi`` with a generator that applies ``settings``' limits (cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            _apply_limits(schema, settings)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def route_methods(routers: Iterable[APIRouter]) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    """(path regex, methods) of every route, so a 405 can list every method its path allows."""
    out = []
    for router in routers:
        for route in router.routes:
            path, methods = getattr(route, "path", None), getattr(route, "methods", None)
            if path and methods:
                out.append((compile_path(path)[0], frozenset(methods)))
    return out


def _apply_limits(schema: dict[str, Any], s: Settings) -> None:
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (DocumentIn, DocumentsIn):
        extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(extra.pop("$defs", {}))
        comps.setdefault(model.__name__, extra)
    ask = comps.get("AskRequest", {}).get("properties", {})
    if ask:
        ask["question"]["maxLength"] = s.max_question_chars
        _bound(ask.get("top_k"), minimum=1, maximum=s.max_top_k)
        _bound(ask.get("max_tokens"), minimum=1, maximum=s.max_tokens_limit)
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = comps.get(name, {}).get("properties", {})
        for field in ("max_tokens", "max_completion_tokens"):
            _bound(props.get(field), minimum=1, maximum=s.max_tokens_limit)
        if "messages" in props:
            props["messages"]["maxItems"] = s.max_messages
        # options OpenAI defines and this server refuses with a 400 naming them: show what is accepted
        _bound(props.get("n"), minimum=1, maximum=1)
        for field in ("presence_penalty", "frequency_penalty"):
            _constrain(props.get(field), "number", minimum=0, maximum=0)
        _constrain(props.get("logit_bias"), "object", maxProperties=0)
    chat = comps.get("ChatCompletionRequest", {}).get("properties", {})
    _constrain(chat.get("logprobs"), "boolean", enum=[False])
    _bound(chat.get("top_logprobs"), minimum=0, maximum=0)
    _constrain(chat.get("tools"), "array", maxItems=0)
    _constrain(chat.get("response_format"), "object", properties={"type": {"enum": ["text"]}})
    text = comps.get("CompletionRequest", {}).get("properties", {})
    _constrain(text.get("echo"), "boolean", enum=[False])
    _constrain(text.get("suffix"), "string", maxLength=0)
    _bound(text.get("best_of"), minimum=1, maximum=1)
    if "logprobs" in text:
        text["logprobs"] = {"type": "null", "title": "Logprobs", "description": "not supported"}
    for option in text.get("prompt", {}).get("anyOf", []):
        if option.get("type") == "array" and option.get("items", {}).get("type") != "integer":
            option["maxItems"] = 1  # one prompt per request


def _bound(prop: dict[str, Any] | None, *, minimum: int, maximum: int) -> None:
    """Set integer bounds on a property, whether it is ``{"type": "integer"}`` or ``anyOf [int, null]``."""
    _constrain(prop, "integer", minimum=minimum, maximum=maximum)


def _constrain(prop: dict[str, Any] | None, json_type: str, **constraints: Any) -> None:
    """Add ``constraints`` to the options of ``prop`` whose type is ``json_type``."""
    if prop is None:
        return
    for option in prop.get("anyOf", [prop]):
        if option.get("type") == json_type:
            option.update(constraints)
