"""Real measurements: the engine, caching off, and transformers' generate on the same request stream.

The engine configurations run the whole stream, interleaved request by request: in each round every
configuration that runs that request takes its turn, the order rotating from round to round, so that
the load other processes put on the machine falls on all of them alike. Caching off and transformers'
``generate`` do not depend on what came before, so they run on an evenly spread sample of the stream
(transformers on a subset of caching off's requests); every comparison with them is made on the
requests both sides ran (``rag.benchmark.results.paired_speedup``). TTFT runs use ``max_tokens=1``
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
from functools import partial
from typing import Any, TypeVar

from engine.config import EngineConfig
from engine.engine import Engine
from engine.models import LoadedModel
from engine.sampling import SamplingParams
from rag.benchmark.baselines import LlamaCppBaseline, TransformersBaseline, bundled_gguf
from rag.benchmark.conversation import PromptBuilder
from rag.benchmark.stats import TokenCounts, summarize
from rag.benchmark.sweep import SweepPoint, bench_rag_config
from rag.benchmark.workload import Workload
from rag.knowledge_base import KnowledgeBase
from rag.pipeline import Pipeline
from rag.prompt.template import ChatLayout

OFF = "caching off"
TRANSFORMERS = "transformers generate"
LLAMA_CPP = "llama.cpp prompt cache"
TTFT_PARAMS = SamplingParams(max_tokens=1)
T = TypeVar("T")


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
    places: list[int] = field(default_factory=list)  # its turn in each round it ran (0: first)
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
    off_at, hf_at = sampled_requests(n, baseline_samples, transformers_samples)
    reference: list[list[int]] = []
    try:
        for i, req in enumerate(workload.requests):
            prompts = [b.prompt(req) for b in builders]  # each from its own engine's cache, as served
            reference.append(prompts[0])
            turns: list[tuple[Measurement, Callable[[], None]]] = [
                (runs[point.label], partial(_time_engine, eng, runs[point.label], i, ids, req.tenant))
                for eng, ids, (point, _) in zip(engines, prompts, configs)
            ]
            if i in off_at:
                turns.append((runs[OFF], partial(_time_engine, off, runs[OFF], i, prompts[0], req.tenant)))
            if i in hf_at:
                into = runs[TRANSFORMERS]
                turns.append((into, partial(_time_baseline, hf.ttft, into, i, prompts[0])))
            if llama is not None:
                into = runs[LLAMA_CPP]
                turns.append((into, partial(_time_llama_cpp, llama, into, i, prompts[0])))
            for place, (measured, run) in enumerate(rotated(turns, i)):
                run()
                measured.places.append(place)
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


def sampled_requests(n: int, off_samples: int, transformers_samples: int) -> tuple[set[int], set[int]]:
    """The requests caching off runs (spread evenly over the stream) and those transformers runs (spread
    evenly over caching off's), so every baseline shares its requests with every other configuration.

    >>> [sorted(s) for s in sampled_requests(10, 4, 2)]
    [[0, 3, 6, 9], [0, 9]]
    """
    off = sample_indices(n, off_samples)
    return set(off), {off[j] for j in sample_indices(len(off), transformers_samples)}


def rotated(turns: Sequence[T], i: int) -> list[T]:
    """``turns`` starting at position i mod len: over the rounds each takes every place in the order.

    >>> rotated(["a", "b", "c"], 4)
    ['b', 'c', 'a']
    """
    k = i % len(turns) if turns else 0
    return [*turns[k:], *turns[:k]]


def _time_engine(engine: Engine, into: Measurement, i: int, ids: list[int], namespace: str) -> None:
    r = engine.generate(ids, TTFT_PARAMS, namespace=namespace)
    into.add(i, r.ttft_s, ids, r.cached_tokens, r.phases)


def _time_baseline(ttft: Callable[[list[int]], float], into: Measurement, i: int, ids: list[int]) -> None:
    into.add(i, ttft(ids), ids, 0, {})


def _time_llama_cpp(llama: LlamaCppBaseline, into: Measurement, i: int, ids: list[int]) -> None:
    first = llama.first_token(ids)  # its own cached tokens: the prompt tokens llama.cpp did not evaluate
    into.add(i, first.ttft_s, ids, first.cached_tokens, {})
