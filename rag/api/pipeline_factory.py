"""Build the document pipeline around a loaded engine (``rag.pipeline.Pipeline``)."""

from __future__ import annotations

from typing import Any

from rag.api.settings import Settings
from rag.pipeline import Pipeline


def build_pipeline(settings: Settings, engine: Any) -> Pipeline:
    """The pipeline for ``settings.rag`` over ``engine``; opens the index saved in ``settings.index_dir``
    when there is one (else starts empty and saves there on the first change). With
    ``settings.warm_up`` the embedder and tokenizer load now rather than on the first question. With
    ``settings.public_prefix_cache`` the shared collection's chunks are public material."""
    update: dict[str, Any] = {"engine": settings.engine}  # one engine config: the server's
    if settings.index_dir is not None:
        update["index_dir"] = settings.index_dir
    if settings.public_prefix_cache and settings.shared_collection is not None:
        update["public_collections"] = [settings.shared_collection]
    config = settings.rag.model_copy(update=update)
    pipeline = Pipeline.from_config(config, engine=engine)
    if settings.warm_up:
        pipeline.warm_up()
    return pipeline
