"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``, never a stack trace.

Routers raise ``api_error(...)`` (an HTTPException carrying the fields); the handlers installed by
``install_error_handlers`` turn that, validation errors, the engine's QueueFullError and anything
unexpected into JSON with the right status.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.request import EngineError, QueueFullError
from rag.stores.protocol import StoreUnavailable

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status (``server_error`` for any 5xx without its own).

    >>> error_type(404), error_type(500), error_type(502), error_type(418)
    ('not_found_error', 'server_error', 'server_error', 'api_error')
    """
    return _TYPES.get(status, "server_error" if status >= 500 else "api_error")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


class InvalidRequest(ValueError):
    """A well-formed request this server cannot honour; answered with 400 naming ``param``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class TooManyRequests(Exception):
    """The API's in-flight cap is reached; answered with 429 and ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServiceUnavailable(Exception):
    """The model (or index) is not loaded yet, or failed to load; answered with 503."""

    def __init__(self, message: str, retry_after_s: float | None = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def api_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    type: str | None = None,
    headers: dict[str, str] | None = None,
) -> HTTPException:
    """An HTTPException whose handler renders OpenAI's error shape (raise it from routers)."""
    detail = {
        "message": message,
        "type": type or error_type(status),
        "param": param,
        "code": code,
    }
    return HTTPException(status_code=status, detail=detail, headers=headers)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None
) -> dict[str, Any]:
    err = ErrorDetail(
        message=message,
        type=type or error_type(status),
        param=param,
        code=code,
    )
    return {"error": err.model_dump()}


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    type: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = error_body(status, message, param=param, code=code, type=type)
    return JSONResponse(body, status_code=status, headers=headers)


def retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


# ---- handlers ---------------------------------------------------------------------------------


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if isinstance(exc.detail, dict) and "message" in exc.detail:
        d = exc.detail
        return error_response(
            exc.status_code,
            str(d["message"]),
            param=d.get("param"),
            code=d.get("code"),
            type=d.get("type"),
            headers=headers,
        )
    message = str(exc.detail)
    code = None
    if exc.status_code == 404 and message == "Not Found":
        message, code = f"no route for {request.method} {request.url.path}", "route_not_found"
    elif exc.status_code == 405:
        message, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        allowed = _allowed_methods(request)
        if allowed:
            headers["Allow"] = ", ".join(allowed)
            message += f" (allowed: {headers['Allow']})"
    elif exc.status_code == 413:
        code = "request_too_large"
    elif exc.status_code == 400 and message == "There was an error parsing the body":
        message, code = (
            "the request body could not be parsed (malformed or too deeply nested JSON)",
            "invalid_json",
        )
    return error_response(exc.status_code, message, code=code, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        first = next(e for e in errors if e.get("type") == "json_invalid")
        reason = (first.get("ctx") or {}).get("error", "invalid JSON")
        return error_response(400, f"the request body is not valid JSON: {reason}", code="invalid_json")
    errors = _most_specific(errors)
    parts = []
    for e in errors[:5]:
        loc = _loc(e.get("loc", ()))
        parts.append(f"{loc}: {e.get('msg', 'invalid')}" if loc else str(e.get("msg", "invalid")))
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    first = errors[0] if errors else {}
    return error_response(
        422,
        "; ".join(parts) + more if parts else "invalid request",
        param=_loc(first.get("loc", ())) or None,
        code=str(first.get("type", "validation_error")),
    )


def _most_specific(errors: list[Any]) -> list[Any]:
    """One error per field: when a union fails in every branch, the branch that got furthest."""
    best: dict[str, Any] = {}
    for e in errors:
        loc = tuple(e.get("loc", ()))
        cut = next((i for i, p in enumerate(loc) if _is_tag(p)), len(loc))
        root = _loc(loc[:cut])
        rank = (len(loc), not str(e.get("type", "")).endswith("_type"))  # type mismatches rank last
        if root not in best or rank > best[root][0]:
            best[root] = (rank, e)
    return [e for _, e in best.values()]


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequest)
    return error_response(400, str(exc), param=exc.param, code=exc.code or "invalid_value")


async def _queue_full(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, QueueFullError)
    return error_response(
        429, str(exc), code="queue_full", headers=retry_after(getattr(exc, "retry_after_s", 1.0))
    )


async def _too_many(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TooManyRequests)
    return error_response(429, str(exc), code="too_many_requests", headers=retry_after(exc.retry_after_s))


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceUnavailable)
    headers = retry_after(exc.retry_after_s) if exc.retry_after_s else None
    return error_response(503, str(exc), code="not_ready", headers=headers)


async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StoreUnavailable)
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    return error_response(503, str(exc), code="store_unavailable", headers=retry_after(exc.retry_after_s))


def generation_failed(exc: BaseException) -> str:
    """The message for an EngineError (which may already say "generation failed")."""
    text = str(exc)
    return text if text.startswith("generation failed") else f"generation failed: {text}"


async def _engine_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("engine error on %s %s: %s", request.method, request.url.path, exc)
    return error_response(500, generation_failed(exc), code="engine_error")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal server error (see the server log)", code="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(InvalidRequest, _invalid)
    app.add_exception_handler(QueueFullError, _queue_full)
    app.add_exception_handler(TooManyRequests, _too_many)
    app.add_exception_handler(ServiceUnavailable, _unavailable)
    app.add_exception_handler(StoreUnavailable, _store_unavailable)
    app.add_exception_handler(EngineError, _engine_error)
    app.add_exception_handler(Exception, _unexpected)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route allows on this path (Starlette's 405 names only the first route's)."""
    table = getattr(request.app.state, "route_methods", ())
    path = request.url.path
    methods: set[str] = set()
    for regex, allowed in table:
        if regex.match(path):
            methods |= allowed
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "bytes"})


def _is_tag(part: Any) -> bool:
    """A union-branch label pydantic puts in error locations (``list[int]``, ``constrained-str``, ``Model``)."""
    return isinstance(part, str) and ("[" in part or "-" in part or part in _TYPE_NAMES or part[:1].isupper())


def format_loc(loc: Any) -> str:
    """A pydantic error location as a readable path: ``("body", "messages", 0, "content")`` ->
    ``messages[0].content``."""
    return _loc(loc)


def _loc(loc: Any) -> str:
    """``("body", "messages", 0, "content")`` -> ``messages[0].content`` (union-branch labels dropped)."""
    out = ""
    for part in loc:
        if (part in ("body", "query", "path", "header") and not out) or _is_tag(part):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


# Documented on every router so the OpenAPI schema describes what clients really get.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "Bad request"),
        (401, "Missing or wrong API key"),
        (403, "Needs the admin key"),
        (404, "Unknown model, document or route"),
        (413, "Request body too large"),
        (422, "Validation error"),
        (429, "Too many requests (see Retry-After)"),
        (500, "Internal error"),
        (503, "Model not loaded yet, or the document store does not answer (see Retry-After)"),
    )
}
