"""BenchConfig: what one `prefixrag bench` run sweeps, measures and writes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.chunks.reuse import DEFAULT_SHARE, STRATEGIES
from rag.benchmark.sweep import CAPACITIES, EVICTIONS, ORDERS, SweepPoint
from rag.benchmark.workload import WorkloadSpec

MeasuredSpec = tuple[str, float, str]  # (chunk order, capacity share, eviction)
# `--full`: what the default run leaves out to stay within 30 minutes on 2 cores: the answer-quality
# comparison on twice the questions with every recompute strategy on each at three budgets, and more
# rounds and prompts in the timed sections
FULL_RUN: dict[str, Any] = {
    "requests": 48,
    "engine_repeats": 5,
    "kv_repeats": 2,
    "fidelity_prompts": 11,
    "chunks_budgets": (0.1, 0.2, 0.3),
    "quality_questions": 24,
    "quality_matrix_questions": 6,
    "quality_budgets": (0.1, 0.2, 0.3),
    "quality_every_strategy": True,
}


class BenchConfig(BaseModel):
    """Settings of a benchmark run; ``BenchConfig.quick()`` is the under-3-minutes variant.

    Example:
        >>> cfg = BenchConfig(requests=40, skew=1.2)
        >>> cfg.sweep_skews, cfg.measured_points()[0].label
        ((0.6, 1.0, 1.2, 1.4), 'cache 100% lru s=1.2')
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # workload
    requests: int = Field(default=40, ge=2, description="requests in the stream")
    skew: float = Field(default=1.0, ge=0, description="Zipf exponent of topic popularity (measured)")
    skews: tuple[float, ...] = Field(default=(0.6, 1.0, 1.4), description="skews of the simulated sweep")
    seed: int = 0
    tenants: int = Field(default=1, ge=1)
    turns: int = Field(default=1, ge=1, description="turns per conversation (follow-ups carry history)")
    top_k: int = Field(default=4, ge=1)
    topics: int | None = Field(default=None, ge=1, description="use only the first n corpus topics")
    steady_factor: int = Field(
        default=4,
        ge=0,
        description="also simulate the stream continued to this many times its length "
        "(0: skip): the hit rate once the cache is warm",
    )
    # sweep (simulated, exact hit rates)
    capacities: tuple[float, ...] = CAPACITIES
    orders: tuple[str, ...] = ORDERS
    evictions: tuple[str, ...] = EVICTIONS
    # real measurements; the first measured config is the reference the baselines share prompts with
    measured: tuple[MeasuredSpec, ...] = (
        ("cache", 1.0, "lru"),
        ("cache", 0.25, "lru"),
        ("relevance", 1.0, "lru"),
    )
    baseline_samples: int = Field(
        default=12, ge=2, description="caching-off requests, spread evenly over the stream"
    )
    transformers_samples: int = Field(
        default=6, ge=1, description="transformers generate requests, spread evenly over caching off's"
    )
    tpot_prompts: int = Field(
        default=2, ge=0, description="0: take TPOT from the engine section's decode figures instead"
    )
    tpot_tokens: int = Field(default=32, ge=2)
    answer_tokens: int = Field(default=64, ge=1, description="answer length assumed for throughput")
    # sections of the report
    engine_section: bool = True
    engine_repeats: int = Field(default=3, ge=1)
    engine_decode_tokens: int = Field(default=48, ge=2)
    engine_context_tokens: int = Field(default=1500, ge=64)
    engine_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    engine_decode_repeats: int | None = Field(default=None, ge=1, description="default: max(2, repeats // 2)")
    engine_bfloat16: bool = Field(
        default=True, description="also measure bfloat16 against float32, side by side, in the engine section"
    )
    limits_buffer_bytes: int = Field(
        default=2 << 30,
        ge=1 << 20,
        description="buffer of the memory-bandwidth loops (larger than the last-level cache)",
    )
    kv_section: bool = Field(default=True, description="KV storage formats, the disk and the remote tier")
    kv_repeats: int = Field(
        default=1, ge=1, description="rounds of cold / RAM-warm / disk-after-restart TTFT"
    )
    kv_disk_dtypes: tuple[str, ...] = ("float32", "bfloat16", "int8")
    kv_fidelity_prompts: int = Field(default=6, ge=1, le=11)
    kv_fidelity_tokens: int = Field(default=16, ge=1)
    kv_break_even_lengths: tuple[int, ...] = (64, 256, 1024)
    kv_zero_hit_requests: int = Field(default=6, ge=2)
    kv_remote: bool = Field(
        default=True,
        description="also the remote (Redis) tier: a replica on another home reading what one prefilled, "
        "the restart case; runs a throwaway redis-server on 127.0.0.1 (the report says so where none is "
        "installed)",
    )
    weights_section: bool = Field(
        default=True, description="int8 vs float32 weights vs llama.cpp, side by side, and int8's fidelity"
    )
    weights_repeats: int = Field(default=2, ge=1, description="interleaved rounds of the weights section")
    weights_answer_tokens: int = Field(default=64, ge=2, description="tokens of the timed whole answer")
    fidelity_prompts: int = Field(default=6, ge=1, description="prompts int8 is compared with float32 on")
    fidelity_answer_tokens: int = Field(default=32, ge=1, description="greedy tokens compared per prompt")
    fidelity_corpus_tokens: int = Field(default=1024, ge=2, description="corpus tokens for perplexity")
    radix_section: bool = True
    radix_requests: int = Field(default=2000, ge=10)
    radix_levels: tuple[int, ...] = (10_000, 100_000)
    retrieval_section: bool = True
    exactness_section: bool = Field(
        default=True,
        description="the CPU's code paths, the engine's exact_reuse verdict on each, the tiles' cost",
    )
    exactness_all_paths: bool = Field(
        default=True, description="also the narrower code paths the CPU can emulate"
    )
    exactness_repeats: int = Field(default=3, ge=1)
    retrieval_split: Literal["tune", "heldout"] = Field(
        default="heldout", description="eval-set split the retrieval section reports"
    )
    retrieval_variants: bool = Field(
        default=True,
        description="also plain, truncated and multi-vector embeddings (embeds long chunks again)",
    )
    retrieval_rerankers: bool = True
    retrieval_scale_chunks: int = Field(
        default=100_000, ge=100, description="synthetic chunks of the scale run"
    )
    retrieval_timed_questions: int | None = Field(
        default=None, ge=1, description="questions timed per method (default: every question of the split)"
    )
    quick: bool = False
    # chunks section (reuse="chunks": TTFT, reuse and fidelity to full prefill)
    chunks_section: bool = True
    chunks_requests: int = Field(default=8, ge=2, description="TTFT: the first n requests of the stream")
    chunks_budgets: tuple[float, ...] = Field(
        default=(DEFAULT_SHARE,),
        description="recompute shares, each run with the default strategy, 'first' and 'deviation'",
    )
    chunks_fidelity_prompts: int = Field(
        default=2, ge=1, description="stream prompts compared to full prefill (answers: the quality section)"
    )
    chunks_answer_tokens: int = Field(default=32, ge=1, description="greedy answer length compared")
    chunks_kl_positions: int = Field(default=16, ge=1, description="answer positions scored (teacher-forced)")
    # answer-quality section (the QA set: accuracy and agreement with full prefill per setting)
    quality_section: bool = True
    quality_questions: int = Field(default=12, ge=1, description="QA items in the stream (every setting)")
    quality_matrix_questions: int = Field(
        default=4,
        ge=0,
        description="of those, evenly spread, the ones the full-prefill variants (other orders, weights, KV "
        "formats, reranker) run on (0: none)",
    )
    quality_answer_tokens: int = Field(default=40, ge=1, description="greedy answer length")
    quality_agreement_tokens: int = Field(default=16, ge=1, description="leading answer tokens compared")
    quality_kl_positions: int = Field(default=8, ge=0, description="answer positions scored (teacher-forced)")
    quality_budgets: tuple[float, ...] = Field(
        default=(DEFAULT_SHARE,), description="recompute shares, each run with every strategy"
    )
    quality_every_strategy: bool = Field(
        default=False,
        description="every recompute strategy at the default budget on every question (default: only the "
        "engine's default setting there, the others on the slice)",
    )
    quality_reranker: bool = Field(
        default=True,
        description="the retrieval row: full prefill with the embedding reranker where the knowledge base "
        "does not rerank (it embeds every chunk's window vectors the index lacks first)",
    )
    quality_strategies: tuple[str, ...] = Field(
        default=STRATEGIES, description="recompute strategies compared"
    )

    @model_validator(mode="after")
    def _valid(self) -> BenchConfig:
        for order, share, eviction in self.measured:
            if order not in ORDERS or eviction not in EVICTIONS or not 0 < share <= 1:
                raise ValueError(
                    f"measured config {(order, share, eviction)} needs an order in {ORDERS}, "
                    f"a capacity share in (0, 1] and an eviction in {EVICTIONS}"
                )
        if not self.measured:
            raise ValueError("measured is empty: at least one engine configuration must run for real")
        for name in ("chunks_budgets", "quality_budgets"):
            budgets = getattr(self, name)
            if not budgets or any(not 0 < b <= 1 for b in budgets):
                raise ValueError(f"{name} are recompute shares in (0, 1], got {budgets}")
        unknown_strategies = set(self.quality_strategies) - set(STRATEGIES)
        if unknown_strategies:
            raise ValueError(
                f"quality_strategies: unknown {sorted(unknown_strategies)}; allowed {STRATEGIES}"
            )
        bad = [c for c in self.capacities if not 0 <= c <= 1]
        if bad:
            raise ValueError(f"capacities are shares of the working set in [0, 1], got {bad}")
        for name, allowed in (("orders", ORDERS), ("evictions", EVICTIONS)):
            unknown = set(getattr(self, name)) - set(allowed)
            if unknown:
                raise ValueError(f"{name}: unknown {sorted(unknown)}; allowed {allowed}")
        return self

    @classmethod
    def quick_run(cls, **overrides: Any) -> BenchConfig:
        """Fewer requests with two chunks each, one engine configuration measured for real, small sections
        on 600-token prompts."""
        settings: dict[str, Any] = {
            "requests": 6,
            "top_k": 2,  # shorter stream prompts
            "measured": (("cache", 1.0, "lru"),),
            "baseline_samples": 2,
            "transformers_samples": 1,
            "tpot_prompts": 0,
            "engine_repeats": 2,
            "engine_decode_tokens": 12,
            "engine_context_tokens": 600,
            "engine_batch_sizes": (1, 4),
            "engine_decode_repeats": 1,
            "engine_bfloat16": False,
            "limits_buffer_bytes": 512 << 20,
            "weights_repeats": 1,
            "weights_answer_tokens": 16,
            "fidelity_answer_tokens": 16,
            "fidelity_prompts": 1,
            "fidelity_corpus_tokens": 128,
            "radix_requests": 300,
            "kv_repeats": 1,
            "kv_disk_dtypes": ("int8",),
            "kv_fidelity_prompts": 1,
            "kv_fidelity_tokens": 8,
            "kv_break_even_lengths": (64, 128),
            "kv_zero_hit_requests": 2,
            "kv_remote": False,  # the full run measures it; TINY in tests/rag/benchmark/test_run.py too
            "retrieval_section": False,
            "exactness_all_paths": False,
            "exactness_repeats": 1,
            "retrieval_variants": False,
            "retrieval_rerankers": False,
            "retrieval_scale_chunks": 20_000,
            "retrieval_timed_questions": 40,
            "steady_factor": 0,
            "chunks_requests": 2,
            "chunks_budgets": (0.2,),
            "chunks_fidelity_prompts": 1,
            "chunks_answer_tokens": 8,
            "chunks_kl_positions": 4,
            "quality_questions": 2,
            "quality_matrix_questions": 0,
            "quality_kl_positions": 4,
            "quality_budgets": (0.2,),
            "quality_reranker": False,
            "quick": True,
        }
        settings.update(overrides)
        return cls(**settings)

    @property
    def sweep_skews(self) -> tuple[float, ...]:
        """The sweep's skews, the measured skew included, ascending."""
        return tuple(sorted({*self.skews, self.skew}))

    def workload_spec(self, skew: float | None = None) -> WorkloadSpec:
        return WorkloadSpec(
            requests=self.requests,
            skew=self.skew if skew is None else skew,
            seed=self.seed,
            tenants=self.tenants,
            turns=self.turns,
            top_k=self.top_k,
            topics=self.topics,
        )

    def measured_points(self) -> list[SweepPoint]:
        return [SweepPoint(order, share, eviction, self.skew) for order, share, eviction in self.measured]
