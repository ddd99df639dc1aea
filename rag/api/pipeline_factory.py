"""Build the document pipeline around a loaded engine (needs rag.pipeline)."""

from __future__ import annotations

from typing import Any

from rag.api.settings import Settings
from rag.pipeline import Pipeline  # noqa: F401  (ImportError here: no pipeline in this install)


def build_pipeline(settings: Settings, engine: Any) -> Any:
    raise NotImplementedError
