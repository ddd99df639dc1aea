"""API test fixtures: the bundled model behind a real engine, served by a real uvicorn on 127.0.0.1.

Each test module gets one engine (built from the session's loaded model, so nothing reloads) and
builds the servers it needs with ``serve(...)``; every server is stopped at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from engine import Engine, EngineConfig
from rag.api import Settings, create_app
from rag.api.server import BackgroundServer

Serve = Callable[..., AbstractContextManager[BackgroundServer]]


def make_engine(loaded: Any, **config: Any) -> Engine:
    """A fresh engine (own cache, own worker) around the session's model."""
    return Engine(
        loaded.model,
        loaded.tokenizer,
        model_id=loaded.model_id,
        config=EngineConfig(model=loaded.model_id, **config),
    )


@pytest.fixture(scope="module")
def engine(loaded_model: Any) -> Iterator[Engine]:
    eng = make_engine(loaded_model)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def serve() -> Serve:
    """``with serve(settings, engine=...) as server:`` a live server; stopped when the block ends.

    Without an injected pipeline the app builds one around the engine; the fixture turns its warm-up
    off (the embedder then loads on a first question, which engine-only tests never ask).
    """

    @contextmanager
    def _serve(settings: Settings | None = None, **app_kwargs: Any) -> Iterator[BackgroundServer]:
        settings = settings or Settings()
        if app_kwargs.get("pipeline") is None:
            settings = settings.model_copy(update={"warm_up": False})
        app = create_app(settings, **app_kwargs)
        with BackgroundServer(app, keep_alive_s=settings.keep_alive_s) as server:
            yield server

    return _serve
