"""Shared fixtures: the real bundled models, loaded once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def loaded_model():
    from engine.models import load_model

    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def embedder():
    from rag.retrieval.embedder import Embedder

    emb = Embedder()
    emb.warm_up()
    return emb
