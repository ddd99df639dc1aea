"""int8 weights vs float32 vs llama.cpp, side by side on the same RAG prompts .

Three systems answer the same ~1,500-token prompts (a Python-reference context and one question each),
with the same threads, interleaved round by round (the order rotates, so the machine's load falls on
all of them alike): the engine with float32 weights, the engine with int8 weights, and llama.cpp on
the bundled GGUF when ``llama-cpp-python`` is installed. Every cell is the system's own measurement,
timed by the same client code; a figure a system does not have stays empty (None).

Example:
    >>> out = run_weights_bench(loaded, repeats=3, llama_cpp=True)        # doctest: +SKIP
    >>> out["systems"]["int8"]["decode_ms_per_token"]                    # doctest: +SKIP
    18.2
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.config import EngineConfig
from engine.engine import Engine
from engine.models import LoadedModel
from engine.sampling import SamplingParams
from rag.benchmark.baselines import FirstToken, LlamaCppBaseline, TimedAnswer, bundled_gguf
from rag.benchmark.engine_bench import QUESTIONS, batched_decode, rag_context, rag_messages
from rag.benchmark.weights_fidelity import measure_fidelity

LLAMA = "llama.cpp"


class EngineSystem:
    """The engine as one of the compared systems (a fresh tenant namespace is a cold start)."""

    def __init__(self, loaded: LoadedModel, weights: str) -> None:
        config = EngineConfig(model=loaded.model_id, weights=weights)  # type: ignore[arg-type]
        self.engine = Engine(loaded.model, loaded.tokenizer, model_id=loaded.model_id, config=config)
        self.namespace = "warm"
        self._fresh = 0
        self._prompts = 0  # first-token prompts cached in the current namespace

    def forget(self) -> None:
        self._fresh += 1
        self.namespace = f"cold-{self._fresh}"
        self._prompts = 0

    def first_token(self, ids: Sequence[int]) -> FirstToken:
        r = self.engine.generate(list(ids), SamplingParams(max_tokens=1), namespace=self.namespace)
        self._prompts += 1
        return FirstToken(r.ttft_s, r.cached_tokens)

    def answer(self, ids: Sequence[int], tokens: int) -> TimedAnswer:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True)
        t0 = time.perf_counter()
        first = last = 0.0
        result = None
        for event in self.engine.stream(list(ids), params, namespace=self.namespace):
            now = time.perf_counter() - t0
            if event.result is not None:
                result = event.result
            elif event.token_ids:
                first, last = first or now, now
        assert result is not None
        return TimedAnswer(first, last, result.completion_tokens)

    def kv_bytes_per_prompt(self) -> float:
        """KV bytes the cache holds per prompt served since ``forget`` (shared prefixes held once)."""
        return self.engine.cache_stats(self.namespace).used_bytes / max(self._prompts, 1)

    def weight_bytes(self) -> int:
        return int(self.engine.stats()["weight_bytes"])

    def close(self) -> None:
        self.engine.close()


def run_weights_bench(
    loaded: LoadedModel,
    *,
    repeats: int = 5,
    context_tokens: int = 1500,
    decode_tokens: int = 48,
    answer_tokens: int = 64,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    llama_cpp: bool = False,
    fidelity_prompts: int = 11,
    fidelity_answer_tokens: int = 32,
    fidelity_corpus_tokens: int = 1024,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Cold/warm TTFT, decode, a whole answer, batched decode and KV bytes for each system, then the
    fidelity of int8 against float32."""
    say = progress or (lambda _msg: None)
    context = rag_context(loaded.tokenizer, context_tokens)
    systems: dict[str, Any] = {w: EngineSystem(loaded, w) for w in ("float32", "int8")}
    prompts = [systems["float32"].engine.encode(rag_messages(context, q)) for q in QUESTIONS]
    if llama_cpp:
        systems[LLAMA] = LlamaCppBaseline(bundled_gguf(), cache_bytes=4 << 30)
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in systems}
    try:
        for system in systems.values():  # one-off costs (allocation, kernel selection) out of the way
            system.forget()
            system.first_token(list(range(1000, 1064)))
        for i in range(repeats):
            say(f"int8 vs float32 vs llama.cpp: round {i + 1}/{repeats}")
            names = list(systems)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                _round(systems[name], prompts, i, decode_tokens, answer_tokens, samples[name])
        out: dict[str, Any] = {
            "prompt_tokens": len(prompts[0]),
            "repeats": repeats,
            "answer_tokens": answer_tokens,
            "systems": {name: _summary(samples[name]) for name in systems},
        }
        for name, system in systems.items():
            out["systems"][name]["weight_bytes"] = system.weight_bytes()
        for name in ("float32", "int8"):
            say(f"batched decode, {name}")
            out["systems"][name]["batched_decode"] = batched_decode(
                systems[name].engine,
                [rag_messages(context, q) for q in QUESTIONS],
                decode_tokens,
                batch_sizes,
            )
    finally:
        for system in systems.values():
            if isinstance(system, EngineSystem):
                system.close()
    say("fidelity")
    out["fidelity"] = measure_fidelity(
        loaded,
        prompts[:fidelity_prompts],
        answer_tokens=fidelity_answer_tokens,
        corpus_tokens=fidelity_corpus_tokens,
        progress=say,
    )
    return out


def _round(
    system: Any,
    prompts: list[list[int]],
    i: int,
    decode_tokens: int,
    answer_tokens: int,
    samples: dict[str, list[float]],
) -> None:
    """One round for one system: a cold prompt, then the same context warm with a new question."""
    cold_prompt = prompts[i % len(prompts)]
    system.forget()  # nothing cached: a new tenant (engine), an empty cache and context (llama.cpp)
    cold = system.first_token(cold_prompt)
    warm = system.first_token(prompts[(i + 1) % len(prompts)])  # the context cached, a new question
    kv_bytes = system.kv_bytes_per_prompt()  # the two prompts just cached
    decode = system.answer(prompts[(i + 2) % len(prompts)], decode_tokens)
    answer = system.answer(prompts[(i + 3) % len(prompts)], answer_tokens)
    for key, value in (
        ("cold_ttft_s", cold.ttft_s),
        ("cold_cached_tokens", cold.cached_tokens),
        ("warm_ttft_s", warm.ttft_s),
        ("warm_cached_tokens", warm.cached_tokens),
        ("decode_s_per_token", decode.tpot_s),
        ("answer_s", answer.last_token_s),
        ("answer_tokens", answer.tokens),
        ("kv_bytes_per_cached_prompt", kv_bytes),
    ):
        samples.setdefault(key, []).append(float(value))


def _summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    med = {k: float(statistics.median(v)) for k, v in samples.items()}
    return {
        "cold_ttft_s": med["cold_ttft_s"],
        "cold_cached_tokens": med["cold_cached_tokens"],
        "warm_ttft_s": med["warm_ttft_s"],
        "warm_cached_tokens": med["warm_cached_tokens"],
        "decode_ms_per_token": 1000 * med["decode_s_per_token"],
        "answer_s": med["answer_s"],
        "answer_tokens": med["answer_tokens"],
        "kv_bytes_per_cached_prompt": med["kv_bytes_per_cached_prompt"],
    }
