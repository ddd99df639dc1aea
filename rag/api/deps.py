"""FastAPI dependencies shared by the routers: services, the caller's principal, the ready engine."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from engine.backend import GenerationBackend
from rag.api.access import Access, access_for
from rag.api.auth import ANONYMOUS, Principal, bearer_token
from rag.api.errors import api_error
from rag.api.services import Services
from rag.api.settings import Settings


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def get_settings(request: Request) -> Settings:
    """The app's settings (its services hold them). Not a dependency override: FastAPI analyses an
    overridden dependency's signature again on every request (~4 ms a request here)."""
    return get_services(request).settings


def current_principal(
    services: Annotated[Services, Depends(get_services)],
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    """The caller's tenant. With tenant keys configured a valid bearer key is required (401 otherwise);
    without them every caller is the anonymous tenant (a stray key, like the openai client's
    placeholder, is ignored) and only the admin key means more."""
    token = bearer_token(authorization)
    found = services.keys.lookup(token) if token else None
    if found is not None:
        return found
    if services.keys.required:
        reason = "missing API key" if token is None else "invalid API key"
        raise api_error(
            401,
            f"{reason}: send 'Authorization: Bearer <key>'",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Principal(ANONYMOUS)


def require_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    """Admin routes: the admin key only (403 for any other caller)."""
    if not principal.admin:
        raise api_error(403, "this route needs the admin key", code="admin_required")
    return principal


def current_access(
    principal: Annotated[Principal, Depends(current_principal)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> Access:
    """The document collections the caller may read and write."""
    return access_for(principal, settings)


def ready_engine(services: Annotated[Services, Depends(get_services)]) -> GenerationBackend:
    return services.ready_engine()


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServicesDep = Annotated[Services, Depends(get_services)]
PrincipalDep = Annotated[Principal, Depends(current_principal)]
AdminDep = Annotated[Principal, Depends(require_admin)]
AccessDep = Annotated[Access, Depends(current_access)]
EngineDep = Annotated[GenerationBackend, Depends(ready_engine)]
