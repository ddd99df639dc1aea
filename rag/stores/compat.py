"""Ingest-time settings: what a store's data was built with, and whether a config may read it.

The fields below fix how documents became chunks and vectors; a store is only valid with the same
values. A config that leaves one at its default takes the store's value; one that sets it to another
value is refused, naming the field.

Example:
    >>> cfg = check_compatible(RAGConfig(top_k=2), RAGConfig(chunk_size=128), "my-index")
    >>> cfg.chunk_size, cfg.top_k
    (128, 2)
"""

from __future__ import annotations

from typing import Any

from rag.config import RAGConfig

INGEST_FIELDS = (
    "embedder",
    "tokenizer_model",
    "chunk_size",
    "chunk_overlap",
    "title_in_embedding",
    "long_chunks",
)
# Ingest-time fields added after a store may have been written: the value such a store was built with.
_BUILT_BEFORE = {"long_chunks": "truncate"}
# Not properties of the documents: where they live, and the engine that answers from them (indexes
# saved before this rule carry an "engine" entry, which loading ignores).
NOT_SAVED = {"index_dir", "document_store", "engine"}


def saved_config(fields: dict[str, Any]) -> RAGConfig:
    """The config a store recorded (``fields`` as written), with the values of fields added since."""
    saved = {k: v for k, v in fields.items() if k not in NOT_SAVED}
    return RAGConfig.model_validate({**_BUILT_BEFORE, **saved})


def ingest_settings(config: RAGConfig) -> dict[str, Any]:
    """The ingest-time fields of ``config``, as a store records them (JSON)."""
    return {name: config.model_dump(mode="json")[name] for name in INGEST_FIELDS}


def check_compatible(config: RAGConfig, saved: RAGConfig, where: object) -> RAGConfig:
    """``config`` with the saved ingest-time fields; ValueError naming a field that ``config`` sets
    explicitly to another value (a field left at its default takes the saved value)."""
    for name in INGEST_FIELDS:
        if name in config.model_fields_set and getattr(config, name) != getattr(saved, name):
            raise ValueError(
                f"{where} was built with {name}={getattr(saved, name)!r}, but the config asks for "
                f"{getattr(config, name)!r}; re-ingest to change it"
            )
    return config.model_copy(update={name: getattr(saved, name) for name in INGEST_FIELDS})
