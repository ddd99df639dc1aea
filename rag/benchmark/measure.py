"""Real measurements: the engine, caching off, and transformers' generate on the same request stream.

The configurations that matter most run the whole stream through the real engine, interleaved
request by request (their order rotating), so that the load other processes put on the machine
falls on all of them alike. Caching-off and transformers' ``generate`` do not depend on what came
before, so they run on an evenly spread sample of the same prompts. TTFT runs use ``max_tokens=1``
(the engine then caches the prompt only, which is what the simulation replays exactly); time per
output token is measured apart, on a few prompts.

Example:
    >>> runs = measure_stream(loaded, kb, workload, [(point, capacity_bytes)],
    ...                       baseline_samples=8, transformers_samples=4)      # doctest: +SKIP
    >>> runs["cache 100% lru s=1"].cached_tokens[:3]                         # doctest: +SKIP
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig
from engine.engine import Engine
from engine.models import LoadedModel
from engine.sampling import SamplingParams
from rag.benchmark.baselines import LlamaCppBaseline, TransformersBaseline, bundled_gguf
from rag.benchmark.conversation import PromptBuilder
from rag.benchmark.stats import TokenCounts, summarize
from rag.benchmark.sweep import SweepPoint, bench_rag_config
from rag.benchmark.workload import Workload
from rag.ingestion.store import KnowledgeBase
from rag.pipeline import Pipeline
from rag.prompt.template import ChatLayout

OFF = "caching off"
TRANSFORMERS = "transformers generate"
LLAMA_CPP = "llama.cpp prompt cache"
TTFT_PARAMS = SamplingParams(max_tokens=1)


@dataclass
class Measurement(TokenCounts):
    """Measured requests of one configuration (indices into the workload's stream)."""

    name: str
    kind: str  # "engine" (caching on), "engine-off", "transformers", "llama.cpp"
    point: SweepPoint | None = None
    capacity_bytes: int = 0
    indices: list[int] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    prompt_hashes: list[int] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)
    observed_bytes_per_token: float | None = None

    def add(self, index: int, ttft: float, prompt: list[int], cached: int, phases: dict[str, float]) -> None:
        self.indices.append(index)
        self.ttft_s.append(ttft)
        self.prompt_tokens.append(len(prompt))
        self.prompt_hashes.append(hash(tuple(prompt)))
        self.cached_tokens.append(cached)
        self.phases.append(phases)

    def summary(self) -> dict[str, Any]:
        assembly = [ph.get("match", 0.0) + ph.get("load", 0.0) + ph.get("insert", 0.0) for ph in self.phases]
        return {
            "requests": len(self.indices),
            "ttft_s": summarize(self.ttft_s),
            "token_hit_rate": self.token_hit_rate,
            "prompt_tokens_mean": statistics.fmean(self.prompt_tokens) if self.prompt_tokens else math.nan,
            "cache_assembly_ms_median": 1000 * statistics.median(assembly) if assembly else math.nan,
        }


def sample_indices(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)``, first and last included.

    >>> sample_indices(10, 4), sample_indices(3, 5), sample_indices(7, 1)
    ([0, 3, 6, 9], [0, 1, 2], [0])
    """
    if k <= 0 or n <= 0:
        return []
    if k >= n:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _engine(loaded: LoadedModel, config: EngineConfig) -> Engine:
    return Engine(loaded.model, loaded.tokenizer, model_id=loaded.model_id, config=config)


def warm_up_engine(engine: Engine) -> None:
    """One short request so one-off costs (allocation, kernel selection) stay out of the figures;
    the cache is reset after, so the measured stream starts from an empty cache."""
    engine.generate(list(range(1000, 1064)), TTFT_PARAMS, namespace="warm-up")
    engine.reset_cache()


def measure_stream(
    loaded: LoadedModel,
    knowledge_base: KnowledgeBase,
    workload: Workload,
    configs: Sequence[tuple[SweepPoint, int]],
    *,
    baseline_samples: int,
    transformers_samples: int,
    llama_cpp: bool = False,
    llama_cpp_cache_bytes: int = 0,
    advance: Callable[[str], None] | None = None,
) -> tuple[dict[str, Measurement], list[list[int]]]:
    """Run the stream; returns the measurements by name and the reference config's prompts.

    ``configs[0]`` is the reference: caching off and the baselines get its prompts.
    """
    if not configs:
        raise ValueError("configs is empty: the first engine configuration is the reference")
    say = advance or (lambda _msg: None)
    layout = ChatLayout(loaded.tokenizer)
    engines, builders, runs = [], [], {}
    for point, capacity in configs:
        eng = _engine(loaded, EngineConfig(cache_bytes=capacity, eviction=point.eviction))  # type: ignore[arg-type]
        pipeline = Pipeline(bench_rag_config(point.order), engine=eng, knowledge_base=knowledge_base)
        engines.append(eng)
        builders.append(PromptBuilder(pipeline.assemble, layout))
        runs[point.label] = Measurement(point.label, "engine", point, capacity)
    off = _engine(loaded, EngineConfig(enable_prefix_cache=False))
    runs[OFF] = Measurement(OFF, "engine-off")
    hf = TransformersBaseline(loaded.model, pad_token_id=loaded.tokenizer.eos_token_id)
    runs[TRANSFORMERS] = Measurement(TRANSFORMERS, "transformers")
    llama = LlamaCppBaseline(bundled_gguf(), llama_cpp_cache_bytes) if llama_cpp else None
    if llama is not None:
        runs[LLAMA_CPP] = Measurement(LLAMA_CPP, "llama.cpp")
    for eng in [*engines, off]:
        warm_up_engine(eng)
    hf.ttft(list(range(1000, 1064)))
    n = len(workload.requests)
    off_at, hf_at = set(sample_indices(n, baseline_samples)), set(sample_indices(n, transformers_samples))
    reference: list[list[int]] = []
    try:
        for i, req in enumerate(workload.requests):
            prompts: dict[int, list[int]] = {}
            for k in rotation(len(engines), i):
                ids = prompts[k] = builders[k].prompt(req)
                r = engines[k].generate(ids, TTFT_PARAMS, namespace=req.tenant)
                runs[configs[k][0].label].add(i, r.ttft_s, ids, r.cached_tokens, r.phases)
            ref = prompts[0]
            reference.append(ref)
            if i in off_at:
                r = off.generate(ref, TTFT_PARAMS, namespace=req.tenant)
                runs[OFF].add(i, r.ttft_s, ref, r.cached_tokens, r.phases)
            if i in hf_at:
                runs[TRANSFORMERS].add(i, hf.ttft(ref), ref, 0, {})
            if llama is not None:
                runs[LLAMA_CPP].add(i, llama.ttft(ref), ref, 0, {})
            say(f"request {i + 1}/{n}")
        for (point, _), eng in zip(configs, engines):
            stats = eng.cache.stats()
            runs[point.label].observed_bytes_per_token = stats.used_bytes / max(stats.cached_tokens, 1)
    finally:
        for eng in [*engines, off]:
            eng.close()
            eng.reset_cache()  # free the KV now: engines sit in reference cycles gc collects late
    return runs, reference


def measure_tpot(
    loaded: LoadedModel, prompts: Sequence[Sequence[int]], tokens: int
) -> dict[str, dict[str, float]]:
    """Seconds per output token after the first, engine vs transformers' generate, on the same prompts.

    The engine decodes after a warm prefill (the prompt cached by a first call), transformers
    as (t(n) - t(1)) / (n - 1); both greedy, ``tokens`` new tokens, EOS ignored.
    """
    if tokens < 2:
        raise ValueError(f"tokens must be >= 2, got {tokens}")
    eng = _engine(loaded, EngineConfig(cache_bytes=1 << 30))
    hf = TransformersBaseline(loaded.model, pad_token_id=loaded.tokenizer.eos_token_id)
    ours, theirs = [], []
    try:
        for ids in prompts:
            eng.generate(list(ids), TTFT_PARAMS, namespace="tpot")
            r = eng.generate(list(ids), SamplingParams(max_tokens=tokens, ignore_eos=True), namespace="tpot")
            ours.append(r.tpot_s)
            theirs.append(hf.tpot(ids, tokens))
    finally:
        eng.close()
    return {"engine": summarize(ours), "transformers": summarize(theirs)}


def rotation(n: int, i: int) -> list[int]:
    """0..n-1 starting at i mod n: each configuration goes first equally often."""
    return [(i + j) % n for j in range(n)]
