"""Reliability fixtures: the API tests' engine and in-process server factory (real uvicorn on 127.0.0.1)."""

from tests.api.conftest import engine, serve

__all__ = ["engine", "serve"]
