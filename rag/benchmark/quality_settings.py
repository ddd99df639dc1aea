"""What the answer-quality section compares: each setting's engine, reuse mode, chunk order and cache.

* ``full prefill``: the reference. Float32 weights and KV, relevance order, every question in a fresh
  namespace (nothing to reuse: the prompt is computed whole, as with caching off).
* prefix mode (exact) under each chunk order: the default ``cache`` order after ``Pipeline.warm()``
  (every chunk placement cached, as after ``prefixrag ingest --warm``), and each order on a cold
  cache, where only the stream itself fills it;
* chunks mode after warming, at each recompute strategy and budget (equal budgets side by side): the
  engine's default setting on every question, the others on the matrix slice (``quality_every_strategy``,
  part of ``--full``: every strategy at the default budget on every question);
* float32 / bfloat16 / int8 weights and each KV storage format, as full prefill;
* full prefill with the other retrieval in the corpus questions: the embedding reranker where the
  knowledge base's default does not rerank, the first stage alone where it does.

Rows marked ``matrix`` run on the matrix slice of the questions only (they cost a full prefill each).

Example:
    >>> [s.name for s in quality_settings(BenchConfig.quick_run())][:2]   # doctest: +SKIP
    ['full prefill', 'prefix, cache order, after warm()']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.chunks.reuse import DEFAULT_SHARE, SHARED_STRATEGIES, STRATEGIES, ChunkReuse
from rag.benchmark.config import BenchConfig
from rag.prompt.order import CHUNKS_MODE_ORDER, ORDERS

REFERENCE = "full prefill"
WARM = "warm"  # the engine whose namespace holds every chunk placement
WARM_NAMESPACE = "qa"


@dataclass(frozen=True)
class QualitySetting:
    """One row of the section. ``namespace``: the stream namespace, or None for a fresh one per
    question; ``engine``: the key of the engine that runs it (``ENGINE_OPTIONS``)."""

    name: str
    group: str  # reference, order, chunks, weights, kv, retrieval
    engine: str
    order: str
    reuse: str | ChunkReuse = "prefix"
    namespace: str | None = None
    matrix: bool = False
    rerank: bool | None = None  # the corpus questions' reranking; None: the knowledge base's default

    @property
    def label(self) -> str:
        return self.reuse.label if isinstance(self.reuse, ChunkReuse) else self.name


# engine key -> (weights dtype of the model it runs, EngineConfig options)
ENGINE_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "reference": ("float32", {}),
    WARM: ("float32", {"reuse": "chunks"}),
    "cold": ("float32", {}),
    "bfloat16": ("bfloat16", {"dtype": "bfloat16"}),
    "int8": ("float32", {"weights": "int8"}),
    "kv-bfloat16": ("float32", {"kv_dtype": "bfloat16"}),
    "kv-int8": ("float32", {"kv_dtype": "int8"}),
}


def chunk_settings(budgets: tuple[float, ...], strategies: tuple[str, ...] = STRATEGIES) -> list[ChunkReuse]:
    """The fixed-set strategies (the naive stitch, one token per boundary), then every budgeted one at
    each budget (equal budgets), the engine's default setting among them."""
    default = ChunkReuse()
    shares = sorted({*budgets, default.share})
    out = [ChunkReuse(s, 0.0) for s in strategies if s not in SHARED_STRATEGIES]  # type: ignore[arg-type]
    for strategy in strategies:
        if strategy in SHARED_STRATEGIES:
            out += [ChunkReuse(strategy, share) for share in shares]  # type: ignore[arg-type]
    return out


def _at_default_budget(s: ChunkReuse) -> bool:
    return s.strategy not in SHARED_STRATEGIES or s.share == DEFAULT_SHARE


def quality_settings(config: BenchConfig, reranks: bool = False) -> list[QualitySetting]:
    """Every row, the reference first; ``reranks``: whether the knowledge base's default retrieval
    reranks (the retrieval row is then the first stage alone)."""
    rows = [
        QualitySetting(REFERENCE, "reference", "reference", "relevance"),
        QualitySetting("prefix, cache order, after warm()", "order", WARM, "cache", namespace=WARM_NAMESPACE),
    ]
    rows += [
        QualitySetting(
            f"prefix, {order} order, cold cache",
            "order",
            "cold",
            order,
            namespace=f"cold-{order}",
            matrix=True,
        )
        for order in ORDERS
    ]
    rows += [  # the engine's default on every question (--full: every strategy at its budget), the rest on the slice
        QualitySetting(
            f"chunks, {s.label}",
            "chunks",
            WARM,
            CHUNKS_MODE_ORDER,
            s,
            WARM_NAMESPACE,
            matrix=s != ChunkReuse() and not (config.quality_every_strategy and _at_default_budget(s)),
        )
        for s in chunk_settings(config.quality_budgets, config.quality_strategies)
    ]
    rows += [
        QualitySetting("bfloat16 weights", "weights", "bfloat16", "relevance", matrix=True),
        QualitySetting("int8 weights", "weights", "int8", "relevance", matrix=True),
        QualitySetting("bfloat16 KV", "kv", "kv-bfloat16", "relevance", matrix=True),
        QualitySetting("int8 KV", "kv", "kv-int8", "relevance", matrix=True),
    ]
    if reranks or config.quality_reranker:  # the first stage alone costs nothing more
        rows.append(
            QualitySetting(  # every corpus question (retrieval decides nothing on the synthetic ones)
                "full prefill, first stage only" if reranks else "full prefill, embedding reranker",
                "retrieval",
                "reference",
                "relevance",
                rerank=not reranks,
            )
        )
    return rows
