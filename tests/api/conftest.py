"""API test fixtures: the bundled model behind a real engine, served by a real uvicorn on 127.0.0.1.

Each test module gets one engine (built from the session's loaded model, so nothing reloads) and
builds the servers it needs with ``serve(...)``; every server is stopped at teardown.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import httpx
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
    """``with serve(settings, engine=...) as server:`` a live server; stopped when the block ends."""

    @contextmanager
    def _serve(settings: Settings | None = None, **app_kwargs: Any) -> Iterator[BackgroundServer]:
        app = create_app(settings or Settings(), **app_kwargs)
        with BackgroundServer(app) as server:
            yield server

    return _serve


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds (True) or the timeout passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def assert_error(reply: httpx.Response, status: int, *, code: str | None = None, contains: str = "") -> dict:
    """The reply has ``status`` and OpenAI's error shape, with a readable message."""
    assert reply.status_code == status, (reply.status_code, reply.text)
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    body = reply.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and len(err["message"]) > 5, err
    assert "Traceback" not in err["message"]
    if code is not None:
        assert err["code"] == code, err
    if contains:
        assert contains.lower() in err["message"].lower(), err
    return err


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``, from Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
