"""Engine benchmark: cold vs warm TTFT on a ~1,500-token RAG prompt, overheads, decode speed.

Everything is measured side by side in one process and reported as medians, with ratios, so the
figures hold on a noisy machine. ``run_engine_bench()`` returns a dict; ``prefixrag bench`` renders it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.config import EngineConfig
from engine.dtype import DType, choose_dtype, cpu_bf16_flags
from engine.engine import Engine
from engine.fused import FusedLlamaRunner
from engine.models import DEFAULT_MODEL, load_model
from engine.sampling import SamplingParams
from rag.benchmark.limits import (
    bfloat16_not_run,
    decode_bytes_per_token,
    physical_limits,
    prefill_flops,
    shares,
)

QUESTIONS = [
    "How does Python evaluate the arguments of a function call, and in which order are they bound?",
    "What happens when an exception is raised inside a finally clause of a try statement in Python?",
    "Which objects count as false in a boolean context, and how can a class change its truth value?",
    "How are default parameter values evaluated, and why does a mutable default surprise people?",
    "What is the difference between the is operator and the == operator when comparing two objects?",
    "How does name resolution work for a variable used inside a nested function with nonlocal?",
    "When is the __init_subclass__ hook called and what arguments does it receive from Python?",
    "How do augmented assignment statements like += behave differently for lists and for tuples?",
    "What does the with statement do on entry and exit, and how are exceptions passed to __exit__?",
    "In what order are the base classes searched when an attribute is looked up on an instance?",
    "How do generator expressions differ from list comprehensions in scope and evaluation time?",
]


def rag_context(tokenizer: Any, target_tokens: int = 1500) -> str:
    """A realistic context: Python-reference passages (the bundled corpus) up to ``target_tokens``."""
    from pydoc_data.topics import topics

    parts: list[str] = []
    used = 0
    for name in ("execmodel", "function", "try", "with", "compound", "assignment", "truth", "comparisons"):
        text = topics[name]
        n = len(tokenizer.encode(text, add_special_tokens=False))
        if used + n > target_tokens:
            ids = tokenizer.encode(text, add_special_tokens=False)[: target_tokens - used]
            parts.append(tokenizer.decode(ids))
            break
        parts.append(text)
        used += n
    return "\n\n".join(parts)


def rag_messages(context: str, question: str) -> list[dict[str, str]]:
    system = "You answer questions about Python using only the reference text below.\n\n" + context
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _cache_work(phases: dict[str, float]) -> float:
    """Seconds a request spent in the cache itself: match, KV load, insert."""
    return phases.get("match", 0.0) + phases.get("load", 0.0) + phases.get("insert", 0.0)


def _ttft(engine: Engine, prompt: Any, namespace: str) -> tuple[float, Any]:
    r = engine.generate(prompt, SamplingParams(max_tokens=1), namespace=namespace)
    return r.ttft_s, r


def run_engine_bench(
    model: str = DEFAULT_MODEL,
    dtype: DType = "auto",
    repeats: int = 5,
    decode_tokens: int = 48,
    context_tokens: int = 1500,
    progress: Callable[[str], None] | None = None,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    decode_repeats: int | None = None,
    compare_bfloat16: bool = True,
    limits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure the engine (``dtype``: the engine's default, "auto", unless given) against itself with
    caching off and against transformers' generate, and (``compare_bfloat16``) float32 against
    bfloat16 side by side; each figure as a share of the machine's ``limits`` (rag.benchmark.limits,
    measured here when not given).

    ``progress`` is called once per stage: warm-up, each TTFT round, decode, batched decode, dtypes.
    """
    say = progress or (lambda _msg: None)
    chosen = choose_dtype(dtype)
    dtype = chosen.dtype
    say("physical limits")
    limits = limits or physical_limits()
    loaded = load_model(model, dtype=dtype)
    tok = loaded.tokenizer
    cached = Engine(
        loaded.model, tok, model_id=loaded.model_id, config=EngineConfig(model=model, dtype=dtype)
    )
    off = Engine(
        loaded.model,
        tok,
        model_id=loaded.model_id,
        config=EngineConfig(model=model, dtype=dtype, enable_prefix_cache=False),
    )
    context = rag_context(tok, context_tokens)
    prompts = [rag_messages(context, q) for q in QUESTIONS]
    prompt_tokens = len(cached.encode(prompts[0]))
    out: dict[str, Any] = {
        "model": loaded.model_id,
        "dtype": dtype,
        "dtype_reason": chosen.reason,
        "prompt_tokens": prompt_tokens,
        "limits": limits,
    }
    try:
        say("warm-up")
        _ttft(off, prompts[0], "warmup")
        cold, zero_hit, zero_phases, warm, phases = [], [], [], [], []
        for i in range(repeats):
            say(f"TTFT round {i + 1}/{repeats}")
            p = prompts[i % len(prompts)]
            for engine in (off, cached) if i % 2 == 0 else (cached, off):  # alternate who goes first
                if engine is off:
                    cold.append(_ttft(off, p, "")[0])
                else:  # a new namespace: 0% hits, pays the match and the insert
                    t, r = _ttft(cached, p, f"fresh-{i}")
                    zero_hit.append(t)
                    zero_phases.append(r.phases)
            cached.generate(prompts[-1], SamplingParams(max_tokens=1), namespace="warm")  # context cached
            t, r = _ttft(cached, prompts[(i + 1) % (len(prompts) - 1)], "warm")
            warm.append(t)
            phases.append(r.phases)
            out.setdefault("warm_cached_tokens", r.cached_tokens)
        assembly = [_cache_work(ph) for ph in phases]
        out["ttft"] = {
            "cold_s": _median(cold),
            "cache_zero_hit_s": _median(zero_hit),
            "warm_s": _median(warm),
            "warm_over_cold": _median(warm) / _median(cold),
            "speedup": _median(cold) / _median(warm),
            "zero_hit_overhead": _median(zero_hit) / _median(cold) - 1.0,
            # the cache's own work at 0% hits (same prefill code either way): the overhead without
            # the prefill's run-to-run noise, which on a shared machine can exceed the overhead itself
            "zero_hit_cache_s": _median([_cache_work(ph) for ph in zero_phases]),
            "zero_hit_cache_share": _median([_cache_work(ph) for ph in zero_phases]) / _median(cold),
            # of it, before the first token (match, load) and after it (the insert of the prompt's KV)
            "zero_hit_before_token_s": _median(
                [ph.get("match", 0.0) + ph.get("load", 0.0) for ph in zero_phases]
            ),
            "zero_hit_insert_s": _median([ph.get("insert", 0.0) for ph in zero_phases]),
            "cold_spread": (max(cold) - min(cold)) / _median(cold),
            "assembly_s": _median(assembly),
            "assembly_share_of_warm": _median(assembly) / _median(warm),
            "phases_warm_median_s": {k: _median([ph.get(k, 0.0) for ph in phases]) for k in phases[0]},
        }
        say("decode")
        runs = decode_repeats if decode_repeats is not None else max(2, repeats // 2)
        out["decode"] = _decode_bench(cached, loaded.model, tok, prompts[0], decode_tokens, runs)
        say("batched decode")
        out["batched_decode"] = batched_decode(cached, prompts, decode_tokens, batch_sizes)
        out["shares"] = _shares(cached, out, limits)
        not_run = bfloat16_not_run()
        if compare_bfloat16 and not_run:
            out["dtypes"] = {"not_run": not_run, "cpu": cpu_bf16_flags()}
        elif compare_bfloat16:
            say("float32 vs bfloat16")
            out["dtypes"] = compare_dtypes(model, dtype, (cached, off), prompts, repeats, decode_tokens)
        stats = cached.cache.stats()
        out["cache"] = {
            "bytes_per_token": stats.used_bytes / max(stats.cached_tokens, 1),
            "used_bytes": stats.used_bytes,
            "cached_tokens": stats.cached_tokens,
        }
    finally:
        cached.close()
        off.close()
    return out


class _TokenClock:
    """A ``generate`` streamer that timestamps every token it is handed (the prompt comes first)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def generate_tpot(model: Any, ids: Sequence[int], new_tokens: int, pad_token_id: int | None = None) -> float:
    """Seconds per output token after the first of transformers' ``generate`` (greedy, EOS ignored),
    from the timestamps its streamer hook sees, so prefill noise stays out of the figure.

    Example:
        >>> generate_tpot(loaded.model, prompt_ids, 32)  # doctest: +SKIP
        0.081
    """
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2, got {new_tokens}")
    input_ids = torch.tensor([list(ids)])
    clock = _TokenClock()
    with torch.inference_mode():
        model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad_token_id,
            streamer=clock,
        )
    first, last = clock.times[1], clock.times[-1]  # times[0]: the prompt, handed over before prefill
    return (last - first) / (len(clock.times) - 2)


def _decode_bench(engine: Engine, model: Any, tok: Any, prompt: Any, n: int, repeats: int) -> dict[str, Any]:
    """ms per output token at the prompt's context length: ours vs transformers' generate (``repeats`` runs each)."""
    ours, hf = [], []
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    ids = engine.encode(prompt)
    for i in range(repeats):  # interleaved, so a noisy spell hits both
        ours.append(engine.generate(prompt, params, namespace=f"decode-{i}").tpot_s)
        hf.append(generate_tpot(model, ids, n))
    return {
        "runs": repeats,
        "ours_ms_per_token": 1000 * _median(ours),
        "transformers_generate_ms_per_token": 1000 * _median(hf),
        "speedup": _median(hf) / _median(ours),
    }


def batched_decode(engine: Engine, prompts: list[Any], n: int, batch_sizes: Sequence[int]) -> dict[str, Any]:
    """Aggregate decode throughput with B concurrent requests (the fused runner batches them)."""
    import threading

    rows = {}
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    for batch in batch_sizes:
        for p in prompts[:batch]:
            engine.generate(p, SamplingParams(max_tokens=1), namespace="batch")  # prefill out of the way
        results: list[Any] = []
        threads = [
            threading.Thread(
                target=lambda p=p, out=results: out.append(engine.generate(p, params, namespace="batch"))
            )
            for p in prompts[:batch]
        ]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        tokens = sum(r.completion_tokens for r in results)
        rows[str(batch)] = {
            "tokens_per_s": tokens / wall,
            "ms_per_token_per_request": _median([1000 * r.tpot_s for r in results]),
        }
    return rows


def _shares(engine: Engine, out: dict[str, Any], limits: dict[str, Any]) -> dict[str, float]:
    """Decode at the prompt's context and cold prefill of the prompt, as shares of the limits."""
    runner = engine.runner
    assert isinstance(runner, FusedLlamaRunner)  # the default model always runs on the fused runner
    cfg = runner.config
    tokens = out["prompt_tokens"]
    geometry = engine.kv_geometry
    element = torch.empty(0, dtype=runner.dtype).element_size()
    embedding = runner.model.model.embed_tokens.weight
    figures = {
        "decode_bytes": decode_bytes_per_token(
            runner.weight_bytes(), embedding.numel() * embedding.element_size(), geometry, element, tokens
        ),
        "decode_s": out["decode"]["ours_ms_per_token"] / 1000,
        "prefill_flops": prefill_flops(linear_params(cfg), geometry, int(cfg.num_attention_heads), tokens),
        "cold_s": out["ttft"]["cold_s"],
    }
    return {**figures, **shares(figures, limits, out["dtype"])}


def linear_params(cfg: Any) -> int:
    """Weights of every Linear a token passes through (q/k/v, o, gate/up, down per layer, lm_head)."""
    hidden, heads = int(cfg.hidden_size), int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    per_layer = (heads + 2 * kv_heads) * head_dim * hidden + hidden * heads * head_dim
    per_layer += 3 * int(cfg.intermediate_size) * hidden
    return int(cfg.num_hidden_layers) * per_layer + int(cfg.vocab_size) * hidden


def compare_dtypes(
    model: str,
    dtype: str,
    engines_of_dtype: tuple[Engine, Engine],
    prompts: list[Any],
    repeats: int,
    decode_tokens: int,
) -> dict[str, Any]:
    """float32 against bfloat16, side by side and interleaved: cold TTFT (caching off), warm TTFT (the
    context cached, a new question) and decode ms/token. ``engines_of_dtype``: the (cached,
    caching-off) engines already built in ``dtype``; the other dtype's are built here.

    Example:
        >>> compare_dtypes("smollm2-135m-instruct", "bfloat16", (cached, off), prompts, 3, 32)["speedup"]  # doctest: +SKIP
        {'cold': 2.1, 'warm': 1.6, 'decode': 1.3}
    """
    other = "float32" if dtype == "bfloat16" else "bfloat16"
    loaded = load_model(model, dtype=other)

    def engine(**options: Any) -> Engine:
        config = EngineConfig(model=model, dtype=other, **options)  # type: ignore[arg-type]
        return Engine(loaded.model, loaded.tokenizer, model_id=loaded.model_id, config=config)

    engines = {dtype: engines_of_dtype, other: (engine(), engine(enable_prefix_cache=False))}
    samples: dict[str, dict[str, list[float]]] = {d: {"cold": [], "warm": [], "decode": []} for d in engines}
    params = SamplingParams(max_tokens=decode_tokens, ignore_eos=True)
    try:
        _ttft(engines[other][1], prompts[0], "warmup")
        for i in range(repeats):
            for name in engines if i % 2 == 0 else reversed(list(engines)):  # alternate who goes first
                cached, off = engines[name]
                figures = samples[name]
                figures["cold"].append(_ttft(off, prompts[i % len(prompts)], "")[0])
                cached.generate(prompts[-1], SamplingParams(max_tokens=1), namespace="dtypes")
                figures["warm"].append(_ttft(cached, prompts[(i + 1) % (len(prompts) - 1)], "dtypes")[0])
                run = cached.generate(prompts[i % len(prompts)], params, namespace=f"dtypes-decode-{i}")
                figures["decode"].append(run.tpot_s)
    finally:
        for eng in engines[other]:
            eng.close()
    out: dict[str, Any] = {
        name: {
            "cold_s": _median(f["cold"]),
            "warm_s": _median(f["warm"]),
            "decode_ms_per_token": 1000 * _median(f["decode"]),
        }
        for name, f in samples.items()
    }
    fp32, bf16 = out["float32"], out["bfloat16"]
    out["speedup"] = {  # bfloat16 over float32: > 1 means bfloat16 is faster
        "cold": fp32["cold_s"] / bf16["cold_s"],
        "warm": fp32["warm_s"] / bf16["warm_s"],
        "decode": fp32["decode_ms_per_token"] / bf16["decode_ms_per_token"],
    }
    out["cpu"] = cpu_bf16_flags()
    out["repeats"] = repeats
    return out
