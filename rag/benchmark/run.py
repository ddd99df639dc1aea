"""`prefixrag bench`: workload -> exact sweep -> real measurements -> sections -> files.

Example:
    >>> results = run_benchmark(BenchConfig.quick_run(), Path("bench-results"))   # doctest: +SKIP
    >>> results["targets"][0]["met"]                                           # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import gc
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine.isa import code_paths
from engine.models import LoadedModel, kv_bytes_per_token, load_model
from rag.benchmark.baselines import llama_cpp_status
from rag.benchmark.config import BenchConfig
from rag.benchmark.measure import OFF, TRANSFORMERS, Measurement, measure_stream, measure_tpot, sample_indices
from rag.benchmark.quality_bench import quality_steps
from rag.benchmark.report import write_outputs
from rag.benchmark.results import (
    capacity_monotone,
    first_of_topic,
    measured_rows,
    paired_speedup,
    steady_state,
    sweep_rows,
    targets,
    ttft_fit,
)
from rag.benchmark.stats import summarize
from rag.benchmark.sweep import UNBOUNDED, ReplayResult, Simulator, SweepPoint, SweepResult, run_sweep
from rag.benchmark.texts import SYSTEM_PROMPT, TOOLS
from rag.benchmark.vllm_peer import vllm_status
from rag.benchmark.workload import Workload, build_workload
from rag.knowledge_base import KnowledgeBase
from rag.prompt.assembler import render_tools

Step = Callable[[str], None]


def run_benchmark(
    config: BenchConfig,
    out_dir: Path,
    *,
    console: Console | None = None,
    loaded: LoadedModel | None = None,
    knowledge_base: KnowledgeBase | None = None,
    command: str = "prefixrag bench",
) -> dict[str, Any]:
    """Run everything ``config`` asks for, write the files into ``out_dir``, return the results."""
    console = console or Console()
    started, cpu_started, clock = time.perf_counter(), time.process_time(), _Clock()
    load: list[float] = []  # 1-minute load average at each step: how busy the shared machine was
    with _progress(console, _total_steps(config), load) as step:
        with clock("setup"):
            loaded = loaded or load_model()
            kb = knowledge_base or _demo_knowledge_base(console)
            step("model and index ready")
        with clock("retrieval"):
            workloads = {s: build_workload(config.workload_spec(s), kb) for s in config.sweep_skews}
            step(f"{len(workloads)} request streams retrieved")
        with clock("simulation"):
            bpt = kv_bytes_per_token(loaded.model.config, loaded.model.dtype.itemsize)
            sim = Simulator(
                loaded.tokenizer,
                model_id=loaded.model_id,
                max_context=_max_context(loaded),
                bytes_per_token=bpt,
                knowledge_base=kb,
            )
            sweep = run_sweep(
                sim,
                workloads,
                capacities=config.capacities,
                orders=config.orders,
                evictions=config.evictions,
                on_replay=lambda r: step(f"simulated {r.point.label}"),
            )
            steady = _steady_replay(config, kb, sim)
            if steady is not None:
                step("steady-state stream simulated")
        main = workloads[config.skew]
        working = sweep.working_set_bytes[config.skew]
        points = [(p, int(p.capacity * working)) for p in config.measured_points()]
        llama_ok, llama_note = llama_cpp_status()
        with clock("measurement"):
            runs, reference = measure_stream(
                loaded,
                kb,
                main,
                points,
                baseline_samples=config.baseline_samples,
                transformers_samples=config.transformers_samples,
                llama_cpp=llama_ok,
                llama_cpp_cache_bytes=working,
                advance=step,
            )
        chunks_section = _chunks_section(config, clock, step, loaded, kb, main)
        gc.collect()
        quality_section = _quality_section(config, clock, step, loaded, kb)
        engine_section = _engine_section(config, clock, step)
        gc.collect()  # the measured engines' caches (GBs) before the sections allocate theirs
        weights_section = _weights_section(config, clock, step, loaded, llama_ok)
        gc.collect()
        with clock("tpot"):
            tpot = _tpot(config, loaded, reference, engine_section)
            if weights_section and "llama.cpp" in weights_section["systems"]:  # llama.cpp's own decode
                llama_ms = weights_section["systems"]["llama.cpp"]["decode_ms_per_token"]
                tpot["llama.cpp"] = summarize([llama_ms / 1000])
            step("time per output token")
        radix_section = _radix_section(config, clock, step, bpt)
        kv_section = _kv_section(config, clock, step, loaded, sweep.working_set_bytes[config.skew] // bpt)
        retrieval_section = _retrieval_section(config, clock, step, kb)
        exactness_section = _exactness_section(config, clock, step, loaded)
    results = assemble_results(
        config, workloads, sweep, runs, tpot, kb, sim, bpt, (llama_ok, llama_note), steady
    )
    results["engine_section"] = engine_section
    vllm_ok, vllm_note = vllm_status()
    results["baselines"]["vllm"] = {"available": vllm_ok, "note": vllm_note}
    results["weights_section"] = weights_section
    results["chunks_section"] = chunks_section
    results["quality_section"] = quality_section
    results["radix_section"] = radix_section
    results["kv_section"] = kv_section
    results["retrieval_section"] = retrieval_section
    results["exactness_section"] = exactness_section
    results["meta"] = _meta(command, time.perf_counter() - started)
    results["meta"]["cpu_s"] = time.process_time() - cpu_started  # all threads: the work, load aside
    results["meta"]["load_average"] = {"mean": sum(load) / max(len(load), 1), "max": max(load, default=0.0)}
    results["meta"]["phase_seconds"] = clock.seconds
    write_outputs(results, out_dir)
    return results


def assemble_results(
    config: BenchConfig,
    workloads: dict[float, Workload],
    sweep: SweepResult,
    runs: dict[str, Measurement],
    tpot: dict[str, Any],
    kb: KnowledgeBase,
    sim: Simulator,
    bytes_per_token: int,
    llama: tuple[bool, str],
    steady_replay: ReplayResult | None = None,
) -> dict[str, Any]:
    """Everything but the sections and the run metadata, as plain JSON-able data."""
    fit = ttft_fit(runs)
    steady = steady_state(steady_replay, fit, config.requests) if steady_replay else None
    step = {"engine": tpot["engine"]["p50"], "transformers": tpot["transformers"]["p50"]}
    if "llama.cpp" in tpot:
        step["llama.cpp"] = tpot["llama.cpp"]["p50"]
    main = workloads[config.skew]
    novelty = first_of_topic(main)
    measured = measured_rows(runs, sweep, fit, step, config.answer_tokens, novelty)
    reference = config.measured_points()[0].label
    ref = measured[reference]
    split = ref["ttft_by_topic_novelty"]
    vs_hf = paired_speedup(runs[reference], runs[TRANSFORMERS])
    replay = sweep.find(*_key(config))
    return {
        "config": config.model_dump(mode="json"),
        "workload": _workload_info(config, workloads, sweep, kb, sim, bytes_per_token, replay),
        "fit": fit.to_dict(),
        "tpot": tpot,
        "headline": {
            "reference_name": reference,
            "reference": ref,
            "off": measured[OFF],
            "transformers": measured[TRANSFORMERS],
            "vs_transformers": vs_hf,
            "speedup_vs_transformers": vs_hf["speedup_mean"],
            "off_modelled_mean": measured[OFF]["modelled_ttft_mean_s"],
            "all_match": all(
                m.get("simulation_matches", True) and m.get("prompts_match", True) for m in measured.values()
            ),
            "first_mean": split["first_of_topic"]["mean"],
            "repeat_mean": split["repeat_topic"]["mean"],
            "first_share": sum(novelty) / max(len(novelty), 1),
        },
        "measured": measured,
        "ttft_samples": {name: m.ttft_s for name, m in runs.items()},
        "sweep": sweep_rows(sweep, fit, step["engine"], config.answer_tokens),
        "steady_state": steady,
        "targets": targets(config.skew, sweep, measured, reference, fit, steady),
        "checks": {"capacity_monotone_violations": capacity_monotone(sweep)},
        "baselines": {"llama_cpp": {"available": llama[0], "note": llama[1]}},
    }


def _key(config: BenchConfig) -> tuple[str, float, str, float]:
    p = config.measured_points()[0]
    return p.order, p.capacity, p.eviction, p.skew


def _workload_info(
    config: BenchConfig,
    workloads: dict[float, Workload],
    sweep: SweepResult,
    kb: KnowledgeBase,
    sim: Simulator,
    bytes_per_token: int,
    replay: Any,
) -> dict[str, Any]:
    tok = sim.tokenizer
    main = workloads[config.skew]
    questions = [len(tok.encode(r.question, add_special_tokens=False)) for r in main.requests]
    return {
        "topics": len({c for w in workloads.values() for c in w.popularity}),
        "chunks": kb.n_chunks,
        "skews": sorted(workloads),
        "system_prompt_tokens": len(tok.encode(SYSTEM_PROMPT, add_special_tokens=False)),
        "tools_tokens": len(tok.encode(render_tools(TOOLS), add_special_tokens=False)),
        "stable_tokens": sim.stable_tokens("cache"),
        "question_tokens_mean": sum(questions) / max(len(questions), 1),
        "prompt_tokens_mean": sum(replay.prompt_tokens) / max(len(replay.prompt_tokens), 1),
        "retrieve_ms_median": main.retrieve_ms_median,
        "bytes_per_token": bytes_per_token,
        "working_set_mib": {str(s): b / 2**20 for s, b in sweep.working_set_bytes.items()},
        "working_set_tokens": {str(s): b // bytes_per_token for s, b in sweep.working_set_bytes.items()},
        "most_popular_topics": main.popularity[:5],
    }


def _tpot(
    config: BenchConfig,
    loaded: LoadedModel,
    reference: list[list[int]],
    engine_section: dict[str, Any] | None,
) -> dict[str, Any]:
    """Measured on a few of the stream's prompts, or (tpot_prompts=0) the engine section's decode figures."""
    if config.tpot_prompts == 0 and engine_section:
        dec = engine_section["decode"]
        engine, hf = dec["ours_ms_per_token"] / 1000, dec["transformers_generate_ms_per_token"] / 1000
        return {
            "engine": summarize([engine]),
            "transformers": summarize([hf]),
            "source": f"engine section: decode at a {engine_section['prompt_tokens']}-token context",
        }
    picks = sample_indices(len(reference), max(config.tpot_prompts, 1) + 2)[1:-1] or [0]
    out: dict[str, Any] = measure_tpot(loaded, [reference[i] for i in picks], config.tpot_tokens)
    out["source"] = f"{len(picks)} prompt(s) of the stream, {config.tpot_tokens} tokens each"
    return out


def _engine_section(config: BenchConfig, clock: _Clock, step: Step) -> dict[str, Any] | None:
    if not config.engine_section:
        return None
    from rag.benchmark.engine_bench import run_engine_bench
    from rag.benchmark.limits import physical_limits

    with clock("engine section"):
        out = run_engine_bench(
            repeats=config.engine_repeats,
            decode_tokens=config.engine_decode_tokens,
            context_tokens=config.engine_context_tokens,
            batch_sizes=config.engine_batch_sizes,
            decode_repeats=config.engine_decode_repeats,
            compare_bfloat16=config.engine_bfloat16,
            limits=physical_limits(buffer_bytes=config.limits_buffer_bytes, repeats=3 if config.quick else 5),
            progress=lambda msg: step(f"engine section: {msg}"),
        )
    out["repeats"] = config.engine_repeats
    return out


def _weights_section(
    config: BenchConfig, clock: _Clock, step: Step, loaded: LoadedModel, llama_cpp: bool
) -> dict[str, Any] | None:
    if not config.weights_section:
        return None
    from rag.benchmark.weights_bench import run_weights_bench

    with clock("weights section"):
        return run_weights_bench(
            loaded,
            repeats=config.weights_repeats,
            context_tokens=config.engine_context_tokens,
            decode_tokens=config.engine_decode_tokens,
            answer_tokens=config.weights_answer_tokens,
            batch_sizes=config.engine_batch_sizes,
            llama_cpp=llama_cpp,
            fidelity_prompts=config.fidelity_prompts,
            fidelity_answer_tokens=config.fidelity_answer_tokens,
            fidelity_corpus_tokens=config.fidelity_corpus_tokens,
            progress=step,
        )


def _chunks_section(
    config: BenchConfig, clock: _Clock, step: Step, loaded: LoadedModel, kb: KnowledgeBase, workload: Workload
) -> dict[str, Any] | None:
    if not config.chunks_section:
        return None
    from rag.benchmark.chunks_bench import run_chunks_bench

    gc.collect()  # the stream's engines and their caches go before this section's
    with clock("chunks section"):
        return run_chunks_bench(loaded, kb, workload, config, step)


def _quality_section(
    config: BenchConfig, clock: _Clock, step: Step, loaded: LoadedModel, kb: KnowledgeBase
) -> dict[str, Any] | None:
    if not config.quality_section:
        return None
    from rag.benchmark.quality_bench import run_quality_bench

    with clock("quality section"):
        return run_quality_bench(loaded, kb, config, step)


def _radix_section(
    config: BenchConfig, clock: _Clock, step: Step, bytes_per_token: int
) -> dict[str, Any] | None:
    if not config.radix_section:
        return None
    from rag.benchmark.radix_bench import run_radix_bench

    with clock("radix section"):
        out = run_radix_bench(levels=config.radix_levels, requests=config.radix_requests)
    step("radix section")
    return out


def _kv_section(
    config: BenchConfig, clock: _Clock, step: Step, loaded: LoadedModel, working_set_tokens: int
) -> dict[str, Any] | None:
    if not config.kv_section:
        return None
    from rag.benchmark.kv_tiers_bench import kv_targets, run_kv_tiers_bench

    with clock("kv section"):
        out = run_kv_tiers_bench(
            loaded=loaded,
            context_tokens=config.engine_context_tokens,
            repeats=config.kv_repeats,
            disk_kv_dtypes=config.kv_disk_dtypes,
            fidelity_prompts=config.kv_fidelity_prompts,
            fidelity_tokens=config.kv_fidelity_tokens,
            break_even_lengths=config.kv_break_even_lengths,
            zero_hit_requests=config.kv_zero_hit_requests,
            working_set_tokens=working_set_tokens,
            remote=config.kv_remote,
            progress=lambda msg: step(f"kv section: {msg}"),
        )
    out["targets"] = kv_targets(out)
    return out


def _retrieval_section(
    config: BenchConfig, clock: _Clock, step: Step, kb: KnowledgeBase
) -> dict[str, Any] | None:
    """Every retrieval method on the eval set's split (held-out by default), then the scale run."""
    if not config.retrieval_section:
        return None
    from rag.benchmark.retrieval_scale import ScaleSpec, run_scale
    from rag.evaluation.comparison import compare_methods
    from rag.evaluation.eval_set import load_retrieval_eval

    questions = load_retrieval_eval(config.retrieval_split)
    with clock("retrieval section"):
        methods = compare_methods(
            kb,
            questions,
            split=config.retrieval_split,
            variants=config.retrieval_variants,
            rerankers=config.retrieval_rerankers,
            timed_questions=config.retrieval_timed_questions,
        )
        step("retrieval section: methods compared")
        timed = questions[: config.retrieval_timed_questions]
        scale = run_scale(kb, timed, ScaleSpec(chunks=config.retrieval_scale_chunks, seed=config.seed))
        step("retrieval section: scale run")
    return {"methods": methods, "scale": scale}


def _exactness_section(
    config: BenchConfig, clock: _Clock, step: Step, loaded: LoadedModel
) -> dict[str, Any] | None:
    if not config.exactness_section:
        return None
    from rag.benchmark.exactness_bench import run_exactness_bench

    with clock("exactness section"):
        out = run_exactness_bench(
            loaded,
            repeats=config.exactness_repeats,
            context_tokens=config.engine_context_tokens,
            all_paths=config.exactness_all_paths,
            progress=lambda msg: step(f"exactness section: {msg}"),
        )
    return out


def _steady_replay(config: BenchConfig, kb: KnowledgeBase, sim: Simulator) -> ReplayResult | None:
    """The measured stream continued to ``steady_factor`` times its length (the stream is seeded, so
    its first requests are the measured ones), replayed through an unbounded cache in ``cache`` order."""
    if config.steady_factor <= 1:
        return None
    spec = replace(config.workload_spec(), requests=config.requests * config.steady_factor)
    return sim.replay(build_workload(spec, kb), SweepPoint("cache", 1.0, "lru", config.skew), UNBOUNDED)


def _demo_knowledge_base(console: Console) -> KnowledgeBase:
    return demo_knowledge_base(console)


def demo_knowledge_base(console: Console | None = None) -> KnowledgeBase:
    """The saved demo index of the bundled Python reference (built on first use, then reused)."""
    from rag.config import RAGConfig
    from rag.demo import default_demo_index, open_demo_pipeline

    return open_demo_pipeline(console or Console(), RAGConfig(), default_demo_index()).kb


def _max_context(loaded: LoadedModel) -> int:
    cfg = loaded.model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return int(getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None) or 2048)


def _total_steps(config: BenchConfig) -> int:
    sweep = len(config.sweep_skews) * len(config.orders) * len(config.evictions) * len(config.capacities)
    engine = 3 + config.engine_repeats + int(config.engine_bfloat16) if config.engine_section else 0
    weights = config.weights_repeats + 4 + config.fidelity_prompts if config.weights_section else 0
    steady = int(config.steady_factor > 1)
    chunks = (
        1 + min(config.chunks_requests, config.requests) + config.chunks_fidelity_prompts
        if config.chunks_section
        else 0
    )
    kv = 3 + len(config.kv_disk_dtypes) + 4 * int(config.kv_remote) if config.kv_section else 0
    retrieval = 2 * int(config.retrieval_section)
    quality = quality_steps(config) if config.quality_section else 0
    exactness = (2 + (len(code_paths()) if config.exactness_all_paths else 1)) * int(config.exactness_section)
    sections = engine + weights + int(config.radix_section) + kv + chunks + retrieval + exactness + quality
    return 2 + sweep + steady + config.requests + 1 + sections


@contextmanager
def _progress(console: Console, total: int, load: list[float]) -> Iterator[Step]:
    columns = (
        TextColumn("[bold]bench[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("starting", total=total)
        done, started = 0, time.perf_counter()

        def step(description: str) -> None:
            nonlocal done
            done += 1
            load.append(_load_average())
            progress.update(task, advance=1, description=description)
            if not console.is_terminal and done % max(total // 20, 1) == 0:  # logs: a line every 5%
                console.print(f"bench {done}/{total} {time.perf_counter() - started:.0f}s {description}")

        yield step
        progress.update(task, completed=total, description="writing the report")


class _Clock:
    """Wall seconds per phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


def _meta(command: str, wall_s: float) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "wall_s": wall_s,
        "commit": _git_commit(),
        "machine": {
            "cpu": _cpu_name(),
            "cores": os.cpu_count(),
            "memory_gib": _memory_gib(),
            "platform": platform.platform(terse=True),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "argv": sys.argv,
    }


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return float("nan")


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size / 2**30
    except (ValueError, OSError, AttributeError):
        return float("nan")
