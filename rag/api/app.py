"""create_app: middleware, error handlers and routers; nothing else (the routers hold the endpoints)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from rag.api.errors import install_error_handlers
from rag.api.limits import BodyLimitMiddleware
from rag.api.metrics import MetricsMiddleware
from rag.api.openapi import install_openapi, route_methods
from rag.api.request_id import RequestIdMiddleware
from rag.api.routers import ask, cache, documents, health, metrics, openai, ui, worker
from rag.api.services import Services
from rag.api.settings import Settings, get_settings
from rag.api.version import package_version


def create_app(
    settings: Settings | None = None,
    *,
    engine: Any = None,
    pipeline: Any = None,
    engine_factory: Callable[[], Any] | None = None,
    pipeline_factory: Callable[[Any], Any] | None = None,
) -> FastAPI:
    """The prefixrag HTTP service.

    Pass a prebuilt ``engine`` (and/or ``pipeline``, whose engine is then used) to serve it; otherwise
    the engine is built from ``settings.engine`` in a background thread at startup (``/readyz`` says
    503 until then). ``settings`` defaults to ``get_settings()`` (the ``PREFIXRAG_*`` environment).

    Example:
        >>> app = create_app(Settings(api_keys={"sk-alice-123": "alice"}), engine=engine)  # doctest: +SKIP
        >>> uvicorn.run(app, host="127.0.0.1", port=8000)                                  # doctest: +SKIP
    """
    settings = settings or get_settings()
    services = Services(
        settings,
        engine=engine,
        pipeline=pipeline,
        engine_factory=engine_factory,
        pipeline_factory=pipeline_factory,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services.start()
        try:
            yield
        finally:
            services.close()

    app = FastAPI(
        title="prefixrag",
        version=package_version(),
        description="Retrieval-augmented question answering built around prefix KV-cache reuse.",
        lifespan=lifespan,
    )
    app.state.services = services
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)  # sees every status
    app.add_middleware(RequestIdMiddleware)  # outermost: every response carries X-Request-Id

    routers = [m.router for m in (health, worker, openai, ask, documents, cache, metrics)]
    routers += [ui.router] if settings.enable_ui else []
    for router in routers:
        app.include_router(router)
    app.state.route_methods = route_methods(routers)
    install_openapi(app, settings)
    return app
