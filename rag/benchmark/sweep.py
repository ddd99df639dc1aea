"""The sweep: every (chunk order, capacity, eviction, skew) replayed through a simulated engine.

Capacities are shares of the working set: the bytes an unbounded cache holds at the end of the
stream, taken as the largest over the chunk orders, so 100% holds everything whatever the order
and equal shares are equal bytes across orders. Each replay also runs the oracle on the very same
prompts, so its hit rate bounds the configuration's request by request.

Example:
    >>> sim = Simulator(tokenizer, model_id="m", max_context=8192, bytes_per_token=46_080,
    ...                 config_for=bench_rag_config, knowledge_base=kb)     # doctest: +SKIP
    >>> result = run_sweep(sim, {1.0: workload}, capacities=(0.25, 1.0))    # doctest: +SKIP
    >>> result.replays[0].token_hit_rate                                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig
from rag.benchmark.conversation import PromptBuilder
from rag.benchmark.oracle import PrefixOracle
from rag.benchmark.simulate import SimulatedEngine
from rag.benchmark.stats import TokenCounts
from rag.benchmark.workload import Workload
from rag.config import RAGConfig
from rag.knowledge_base import KnowledgeBase
from rag.pipeline import build_assembler
from rag.prompt.assembler import Prompt, PromptAssembler
from rag.prompt.order import ORDERS
from rag.prompt.template import ChatLayout
from rag.types import ScoredChunk

EVICTIONS = ("lru", "gdsf")
CAPACITIES = (0.0, 0.10, 0.25, 0.50, 1.0)
UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class SweepPoint:
    """One configuration: chunk order, cache capacity (share of the working set), eviction, skew."""

    order: str
    capacity: float
    eviction: str
    skew: float

    @property
    def label(self) -> str:
        return f"{self.order} {self.capacity:.0%} {self.eviction} s={self.skew:g}"


@dataclass
class ReplayResult(TokenCounts):
    """Per-request outcome of one configuration on one stream (token counts, in stream order)."""

    point: SweepPoint
    capacity_bytes: int
    stable_tokens: int
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    oracle_tokens: list[int] = field(default_factory=list)
    evictions: int = 0
    footprint_tokens: int = 0
    prompt_hashes: list[int] = field(default_factory=list)  # to compare with the real runs' prompts
    context_boundary: list[int] = field(default_factory=list)  # see PromptBuilder.last_boundary

    @property
    def oracle_hit_rate(self) -> float:
        return sum(self.oracle_tokens) / max(sum(self.prompt_tokens), 1)

    @property
    def of_oracle(self) -> float:
        """Token hit rate as a share of the oracle's on the same prompts (1.0 when both are 0)."""
        oracle = sum(self.oracle_tokens)
        return sum(self.cached_tokens) / oracle if oracle else 1.0

    @property
    def request_hit_rate(self) -> float:
        """Share of requests that reused any cached token."""
        return sum(c > 0 for c in self.cached_tokens) / max(len(self.cached_tokens), 1)

    @property
    def context_hit_rate(self) -> float:
        """Share of requests that reused retrieved context (a whole first chunk) or their history."""
        reused = sum(c >= b for c, b in zip(self.cached_tokens, self.context_boundary))
        return reused / max(len(self.cached_tokens), 1)

    def summary(self) -> dict[str, Any]:
        return {
            "token_hit_rate": self.token_hit_rate,
            "oracle_hit_rate": self.oracle_hit_rate,
            "of_oracle": self.of_oracle,
            "request_hit_rate": self.request_hit_rate,
            "context_hit_rate": self.context_hit_rate,
            "prompt_tokens_mean": sum(self.prompt_tokens) / max(len(self.prompt_tokens), 1),
            "uncached_tokens_mean": sum(self.uncached_tokens) / max(len(self.prompt_tokens), 1),
            "capacity_bytes": self.capacity_bytes,
            "evictions": self.evictions,
        }


@dataclass
class SweepResult:
    """All replays, plus the working set (bytes) of each skew's stream."""

    working_set_bytes: dict[float, int]
    replays: list[ReplayResult]

    def find(self, order: str, capacity: float, eviction: str, skew: float) -> ReplayResult:
        for r in self.replays:
            p = r.point
            if (p.order, p.eviction, p.skew) == (order, eviction, skew) and abs(p.capacity - capacity) < 1e-9:
                return r
        raise KeyError(f"no replay for {order} {capacity:.0%} {eviction} s={skew:g}")


def bench_rag_config(order: str) -> RAGConfig:
    """The pipeline configuration every benchmark run uses, with the given chunk order."""
    from rag.benchmark.texts import SYSTEM_PROMPT, TOOLS

    return RAGConfig(system_prompt=SYSTEM_PROMPT, tools=TOOLS, chunk_order=order)  # type: ignore[arg-type]


class Simulator:
    """Replays workloads through ``SimulatedEngine``s, one prompt assembler per chunk order."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        model_id: str,
        max_context: int,
        bytes_per_token: int,
        knowledge_base: KnowledgeBase,
        config_for: Callable[[str], RAGConfig] = bench_rag_config,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.max_context = max_context
        self.bytes_per_token = bytes_per_token
        self.layout = ChatLayout(tokenizer)
        self._assemblers = {order: self._assembler(config_for(order), knowledge_base) for order in ORDERS}
        self._static: dict[tuple[str, int], list[tuple[list[int], int]]] = {}

    def stable_tokens(self, order: str = "cache") -> int:
        return len(self._assemblers[order].stable_ids)

    def engine(self, capacity_bytes: int, eviction: str = "lru") -> SimulatedEngine:
        config = EngineConfig(cache_bytes=capacity_bytes, eviction=eviction)  # type: ignore[arg-type]
        return SimulatedEngine(
            self.tokenizer,
            model_id=self.model_id,
            max_context=self.max_context,
            config=config,
            bytes_per_token=self.bytes_per_token,
        )

    def replay(self, workload: Workload, point: SweepPoint, capacity_bytes: int) -> ReplayResult:
        """Serve the stream in order; the oracle serves the very same prompts."""
        sim = self.engine(capacity_bytes, point.eviction)
        oracle = PrefixOracle()
        out = ReplayResult(point, capacity_bytes, self.stable_tokens(point.order))
        for req, (ids, boundary) in zip(workload.requests, self._prompts(workload, point.order, sim)):
            out.prompt_tokens.append(len(ids))
            out.context_boundary.append(boundary)
            out.prompt_hashes.append(hash(tuple(ids)))
            out.cached_tokens.append(sim.serve(ids, req.tenant))
            out.oracle_tokens.append(oracle.serve(ids, req.tenant))
        stats = sim.cache.stats()
        out.evictions, out.footprint_tokens = stats.evictions, stats.cached_tokens
        return out

    def working_set_bytes(self, workload: Workload) -> int:
        """Bytes an unbounded cache holds after the stream, the largest over the chunk orders."""
        tokens = 0
        for order in ORDERS:
            r = self.replay(workload, SweepPoint(order, 1.0, "lru", workload.spec.skew), UNBOUNDED)
            tokens = max(tokens, r.footprint_tokens)
        return tokens * self.bytes_per_token

    def _prompts(
        self, workload: Workload, order: str, sim: SimulatedEngine
    ) -> Iterable[tuple[list[int], int]]:
        """Token ids per request. Only the ``cache`` order depends on the cache, so the others are
        built once per stream and reused by every capacity and eviction policy."""
        if order == "cache":
            return self._build(workload, order, sim)
        key = (order, id(workload))
        if key not in self._static:
            self._static[key] = list(self._build(workload, order, sim))
        return self._static[key]

    def _build(self, workload: Workload, order: str, sim: SimulatedEngine) -> Iterator[tuple[list[int], int]]:
        assembler = self._assemblers[order]

        def assemble(question: str, hits: Sequence[ScoredChunk], namespace: str) -> Prompt:
            return assembler.assemble(
                question, hits, prefix_probe=lambda ids: sim.cached_prefix_length(ids, namespace)
            )

        builder = PromptBuilder(assemble, self.layout)
        for req in workload.requests:  # lazy: each prompt is built after the previous one was served
            ids = builder.prompt(req)
            yield ids, builder.last_boundary

    def _assembler(self, config: RAGConfig, kb: KnowledgeBase) -> PromptAssembler:
        """The assembler ``Pipeline`` builds for this config (the same code path as the real runs)."""
        sim = self.engine(0)
        return build_assembler(config, sim.tokenizer, sim.max_context)


def run_sweep(
    simulator: Simulator,
    workloads: Mapping[float, Workload],
    *,
    capacities: Sequence[float] = CAPACITIES,
    orders: Sequence[str] = ORDERS,
    evictions: Sequence[str] = EVICTIONS,
    on_replay: Callable[[ReplayResult], None] | None = None,
) -> SweepResult:
    """Replay every combination; ``working_set_bytes`` is measured per skew first."""
    working = {skew: simulator.working_set_bytes(w) for skew, w in workloads.items()}
    replays = []
    for skew, workload in workloads.items():
        for order in orders:
            for eviction in evictions:
                for share in capacities:
                    point = SweepPoint(order, share, eviction, skew)
                    r = simulator.replay(workload, point, int(share * working[skew]))
                    replays.append(r)
                    if on_replay is not None:
                        on_replay(r)
    return SweepResult(working, replays)
