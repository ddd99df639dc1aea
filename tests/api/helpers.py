"""Helpers for the API tests: polling, error-shape checks, Prometheus parsing."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx


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
