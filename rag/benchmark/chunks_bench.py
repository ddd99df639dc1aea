"""The chunks section of `prefixrag bench`: chunk KV reuse beyond the prefix, its speed and its cost.

On the first ``chunks_requests`` requests of the benchmark's seeded stream (same seed, same chunks),
interleaved request by request with the order rotating:

* TTFT of caching off (a spread sample), exact prefix mode, chunks mode from a cold cache (the engine's
  default recompute), and chunks mode after warming every chunk the stream retrieves, once per
  recompute setting (``none``, then ``first`` and ``deviation`` at each budget);
* per mode: the share of prompt tokens whose KV was reused (exact prefix + stitched chunks), and the
  stitching's own work (lookups, copies, rotation, selection) as a share of TTFT.

Then fidelity to full prefill (``rag.benchmark.fidelity``) on an evenly spread subset of those prompts,
every setting on the same prompts. What the settings do to the answers themselves is the answer-quality
section's (``rag.benchmark.quality_bench``: the QA set, facts at every chunk position).

Example:
    >>> section = run_chunks_bench(loaded, kb, workload, BenchConfig.quick_run())   # doctest: +SKIP
    >>> section["ttft"]["caching off"]["ttft_s"]["mean"]                              # doctest: +SKIP
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.chunks.reuse import ChunkReuse
from engine.config import EngineConfig
from engine.engine import Engine
from engine.models import LoadedModel
from rag.benchmark.config import BenchConfig
from rag.benchmark.fidelity import FidelityPrompt, compare
from rag.benchmark.measure import TTFT_PARAMS, rotated, sample_indices, warm_up_engine
from rag.benchmark.stats import summarize
from rag.benchmark.sweep import bench_rag_config
from rag.benchmark.workload import Workload
from rag.knowledge_base import KnowledgeBase
from rag.pipeline import Pipeline
from rag.prompt.assembler import Prompt
from rag.warming import WarmReport, warm_chunks

OFF = "caching off"
EXACT = "exact prefix"
CAPACITY = 1 << 36  # "the cache holds the working set": no budget in the way
Step = Callable[[str], None]


@dataclass
class ChunkRun:
    """Measured requests of one configuration of the section."""

    name: str
    kind: str  # "off", "prefix", "chunks cold", "chunks warm"
    setting: ChunkReuse | None = None
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    stitched_tokens: list[int] = field(default_factory=list)
    recomputed_tokens: list[int] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)

    def add(self, result: Any) -> None:
        self.ttft_s.append(result.ttft_s)
        self.prompt_tokens.append(result.prompt_tokens)
        self.cached_tokens.append(result.cached_tokens)
        self.stitched_tokens.append(result.stitched_tokens)
        self.recomputed_tokens.append(result.recomputed_tokens)
        ph = result.phases
        self.overhead_s.append(ph.get("stitch_load", 0.0) + ph.get("stitch_select", 0.0))

    def summary(self, off_mean: float) -> dict[str, Any]:
        ttft = summarize(self.ttft_s)
        prompt = max(sum(self.prompt_tokens), 1)
        stitched = sum(self.stitched_tokens) + sum(self.recomputed_tokens)
        overhead = [o / t for o, t in zip(self.overhead_s, self.ttft_s) if t > 0]
        return {
            "kind": self.kind,
            "setting": self.setting.label if self.setting else None,
            "strategy": self.setting.strategy if self.setting else None,
            "share": self.setting.share if self.setting else None,
            "requests": len(self.ttft_s),
            "ttft_s": ttft,
            "speedup_vs_off_mean": off_mean / ttft["mean"] if ttft["mean"] else float("nan"),
            "prompt_tokens_mean": prompt / max(len(self.prompt_tokens), 1),
            "reuse_share": (sum(self.cached_tokens) + sum(self.stitched_tokens)) / prompt,
            "exact_share": sum(self.cached_tokens) / prompt,
            "recomputed_of_stitched": sum(self.recomputed_tokens) / stitched if stitched else 0.0,
            "overhead_share_mean": statistics.fmean(overhead) if overhead else 0.0,
            "overhead_ms_mean": 1000 * statistics.fmean(self.overhead_s) if self.overhead_s else 0.0,
        }


def chunk_settings(config: BenchConfig) -> list[ChunkReuse]:
    """The naive stitch, then the engine's default strategy, ``first`` and deviation selection at each
    budget (equal budgets)."""
    shares = sorted({*config.chunks_budgets, ChunkReuse().share})
    out = [ChunkReuse("none", 0.0)]
    for strategy in dict.fromkeys((ChunkReuse().strategy, "first", "deviation")):
        out += [ChunkReuse(strategy, share) for share in shares]
    return out


def run_chunks_bench(
    loaded: LoadedModel,
    kb: KnowledgeBase,
    workload: Workload,
    config: BenchConfig,
    advance: Step | None = None,
) -> dict[str, Any]:
    """TTFT, reuse and fidelity of chunk reuse; plain JSON-able results."""
    say = advance or (lambda _msg: None)
    settings = chunk_settings(config)
    default = ChunkReuse()
    requests = [r for r in workload.requests[: config.chunks_requests] if r.turn == 0]
    off = _engine(loaded, enable_prefix_cache=False, batch_invariant=True, max_running=4 * len(settings))
    exact = _engine(loaded)
    cold = _engine(loaded, reuse="chunks")
    warm = _engine(loaded, reuse="chunks", batch_invariant=True, max_running=4 * len(settings))
    engines = [off, exact, cold, warm]
    try:
        for eng in engines:
            warm_up_engine(eng)
        pipelines = {id(e): Pipeline(bench_rag_config("cache"), engine=e, knowledge_base=kb) for e in engines}
        warming = _warm_stream(warm, pipelines[id(warm)], requests)
        say(f"chunks section: warmed {warming.warmed} chunks")
        runs = _measure_ttft(requests, pipelines, off, exact, cold, warm, settings, default, say)
        fid_prompts = _stream_prompts(requests, pipelines[id(warm)], config.chunks_fidelity_prompts)
        fidelity = compare(
            warm,
            off,
            fid_prompts,
            settings,
            answer_tokens=config.chunks_answer_tokens,
            kl_positions=config.chunks_kl_positions,
            advance=say,
        )
    finally:
        for eng in engines:
            eng.close()
            eng.reset_cache()
    off_mean = summarize(runs[OFF].ttft_s)["mean"]
    return {
        "requests": len(requests),
        "settings": [s.label for s in settings],
        "default": default.label,
        "warm": warming.to_dict(),
        "ttft": {name: run.summary(off_mean) for name, run in runs.items()},
        "ttft_samples": {name: run.ttft_s for name, run in runs.items()},
        "fidelity": {label: f.summary() for label, f in fidelity.items()},
        "fidelity_prompts": len(fid_prompts),
        "answer_tokens": config.chunks_answer_tokens,
        "kl_positions": config.chunks_kl_positions,
    }


def _warm_stream(engine: Engine, pipeline: Pipeline, requests: Sequence[Any]) -> WarmReport:
    """Every chunk the requests retrieve, warmed in the namespace of each tenant that retrieves it."""
    total = WarmReport()
    for tenant in sorted({r.tenant for r in requests}):
        chunks = _unique([h for r in requests if r.tenant == tenant for h in r.hits])
        report = warm_chunks(engine, pipeline.assembler, chunks, tenant)
        total.chunks += report.chunks
        total.warmed += report.warmed
        total.already_cached += report.already_cached
        total.not_fitted += report.not_fitted
        total.tokens += report.tokens
        total.seconds += report.seconds
    return total


def _engine(loaded: LoadedModel, **options: Any) -> Engine:
    config = EngineConfig(model=loaded.model_id, cache_bytes=CAPACITY, **options)
    return Engine(loaded.model, loaded.tokenizer, model_id=loaded.model_id, config=config)


def _measure_ttft(
    requests: Sequence[Any],
    pipelines: dict[int, Pipeline],
    off: Engine,
    exact: Engine,
    cold: Engine,
    warm: Engine,
    settings: Sequence[ChunkReuse],
    default: ChunkReuse,
    say: Step,
) -> dict[str, ChunkRun]:
    """Every configuration on every request (caching off on a spread sample), order rotating."""
    runs = {OFF: ChunkRun(OFF, "off"), EXACT: ChunkRun(EXACT, "prefix")}
    runs[f"chunks cold, {default.label}"] = ChunkRun(f"chunks cold, {default.label}", "chunks cold", default)
    for s in settings:
        runs[f"chunks warm, {s.label}"] = ChunkRun(f"chunks warm, {s.label}", "chunks warm", s)
    jobs: list[tuple[str, Engine, Any]] = [
        (EXACT, exact, "prefix"),
        (f"chunks cold, {default.label}", cold, default),
    ]
    jobs += [(f"chunks warm, {s.label}", warm, s) for s in settings]
    off_at = set(sample_indices(len(requests), max(3, len(requests) // 6)))
    for i, req in enumerate(requests):
        for name, eng, reuse in rotated(jobs, i):
            prompt = pipelines[id(eng)].assemble(req.question, req.hits, req.tenant)
            runs[name].add(_generate(eng, prompt, req.tenant, reuse))
            if i in off_at and eng is exact:
                runs[OFF].add(_generate(off, prompt, req.tenant, "prefix"))
        say(f"chunks section: request {i + 1}/{len(requests)}")
    return runs


def _generate(engine: Engine, prompt: Prompt, namespace: str, reuse: Any) -> Any:
    return engine.generate(
        prompt.token_ids, TTFT_PARAMS, namespace=namespace, reuse=reuse, **prompt.stitch_args()
    )


def _stream_prompts(requests: Sequence[Any], pipeline: Pipeline, n: int) -> list[FidelityPrompt]:
    prompts = []
    for i in sample_indices(len(requests), n):
        req = requests[i]
        prompt = pipeline.assemble(req.question, req.hits, req.tenant)
        prompts.append(
            FidelityPrompt(list(prompt.token_ids), list(prompt.chunk_spans), req.tenant, prompt.chunk_context)
        )
    return prompts


def _unique(chunks: Sequence[Any]) -> list[Any]:
    seen: dict[tuple[str, str], Any] = {}
    for c in chunks:
        seen.setdefault((str(c.doc_id), str(c.chunk_id)), c)
    return list(seen.values())
