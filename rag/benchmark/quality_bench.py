"""The answer-quality section of `prefixrag bench`: what chunk order, chunk reuse, weights and KV
formats do to the answers, on the QA set (``rag/data/qa_eval.json``), every setting side by side.

The questions run as one stream (a seeded order), in waves of a few questions: full prefill answers
a wave first (greedy, the pipeline's sampling), then every other engine runs the wave's jobs
(``rag.benchmark.quality_jobs``): each setting's greedy answer and, teacher-forced on full
prefill's answer, its next-token distributions. The rows (``rag.benchmark.quality_settings``)
marked ``matrix`` run on an evenly spread slice of the stream only. TTFT is the engine's (prefill,
queue excluded), per request, within the wave that ran it.

Example:
    >>> section = run_quality_bench(loaded, kb, BenchConfig.quick_run())   # doctest: +SKIP
    >>> section["settings"]["full prefill"]["accuracy"]                     # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.chunks.reuse import ChunkReuse
from engine.config import EngineConfig
from engine.engine import Engine
from engine.models import LoadedModel, load_model
from rag.benchmark.config import BenchConfig
from rag.benchmark.fidelity import kl_divergence
from rag.benchmark.limits import bfloat16_not_run
from rag.benchmark.measure import sample_indices, warm_up_engine
from rag.benchmark.quality_items import RankedItem, rank_items, select_items, unique_chunks
from rag.benchmark.quality_jobs import Job, run_wave
from rag.benchmark.quality_outcomes import Outcome, SettingOutcomes
from rag.benchmark.quality_settings import (
    ENGINE_OPTIONS,
    REFERENCE,
    WARM,
    WARM_NAMESPACE,
    QualitySetting,
    quality_settings,
)
from rag.config import RAGConfig
from rag.evaluation.qa_set import is_correct, load_qa_set
from rag.knowledge_base import KnowledgeBase
from rag.prompt.assembler import PromptAssembler
from rag.warming import WarmReport, warm_chunks

Step = Callable[[str], None]
WAVE = 4  # questions per wave
UNBOUNDED = 1 << 36  # stream engines hold every placement and every prompt of the run
FRESH_BYTES = 1 << 30  # engines whose questions start in fresh namespaces keep a wave's prompts


def run_quality_bench(
    loaded: LoadedModel,
    kb: KnowledgeBase,
    config: BenchConfig,
    advance: Step | None = None,
    settings: Sequence[QualitySetting] | None = None,
) -> dict[str, Any]:
    """Accuracy, agreement with full prefill, KL and TTFT per setting (default: every row of
    ``quality_settings``; the reference must come first); plain JSON-able results."""
    say = advance or (lambda _msg: None)
    started = time.perf_counter()
    items = select_items(load_qa_set(), config.quality_questions, config.seed)
    settings = list(settings or quality_settings(config, reranks=kb.config.reranker != "none"))
    if settings[0].name != REFERENCE:
        raise ValueError(f"the first setting must be the reference ({REFERENCE!r}), got {settings[0].name!r}")
    matrix = set(sample_indices(len(items), min(config.quality_matrix_questions, len(items))))
    settings = [s for s in settings if matrix or not s.matrix]  # no slice: those rows' engines are not built
    bf16_not_run = bfloat16_not_run()
    not_run = {
        s.name: bf16_not_run for s in settings if bf16_not_run and ENGINE_OPTIONS[s.engine][0] == "bfloat16"
    }
    settings = [s for s in settings if s.name not in not_run]
    ranked: dict[bool | None, list[RankedItem]] = {None: rank_items(items, kb, config.top_k)}
    for rerank in {s.rerank for s in settings} - {None}:
        ranked[rerank] = rank_items(items, kb, config.top_k, rerank=rerank)
    stream = ranked[None]
    params = RAGConfig().sampling_params(max_tokens=config.quality_answer_tokens)
    engines = _engines(loaded, settings)
    rows = {s.name: SettingOutcomes(s.name) for s in settings}
    busy = dict.fromkeys(rows, 0.0)  # seconds each row's waves took
    try:
        context = engines[REFERENCE_ENGINE].max_context
        orders = {s.order for s in settings} | {"relevance"}
        asm = {o: PromptAssembler(loaded.tokenizer, order=o, max_context_tokens=context) for o in orders}
        warm = WarmReport()
        if WARM in engines:
            warm = warm_chunks(engines[WARM], asm["relevance"], unique_chunks(stream), WARM_NAMESPACE)
        say(f"quality section: {len(engines)} engines ready, {warm.warmed} chunks warmed")
        setup_s = time.perf_counter() - started
        for wave in _waves(len(stream)):
            for s in _run_order(settings):
                jobs = {
                    n: _job(engines[s.engine], asm, ranked[s.rerank][n], s, rows[REFERENCE], n, config)
                    for n in wave
                    if _runs(s, n in matrix, stream[n])
                }
                clock = time.perf_counter()
                run_wave(list(jobs.values()), params)
                busy[s.name] += time.perf_counter() - clock
                for n, job in jobs.items():
                    ref = rows[REFERENCE].by_item.get(n)
                    rows[s.name].add(n, _outcome(ranked[s.rerank][n], job, ref, config))
            say(f"quality section: {wave[-1] + 1}/{len(stream)} questions")
    finally:
        for eng in engines.values():
            eng.close()
            eng.reset_cache()
    layout = {n: (r.item.kind, r.item.positions) for n, r in enumerate(stream)}
    return {
        "questions": len(stream),
        "matrix_questions": len(matrix),
        "kinds": {k: sum(r.item.kind == k for r in stream) for k in ("corpus", "fact", "two_fact")},
        "answer_tokens": config.quality_answer_tokens,
        "agreement_tokens": config.quality_agreement_tokens,
        "kl_positions": config.quality_kl_positions,
        "warm": warm.to_dict(),
        "not_run": not_run,
        "setup_s": setup_s,
        "seconds": time.perf_counter() - started,
        "settings": {
            s.name: {**_describe(s), **rows[s.name].summary(rows[REFERENCE], layout)} for s in settings
        },
        "answers": {
            s.name: {stream[n].item.id: o.text for n, o in rows[s.name].by_item.items()} for s in settings
        },
    }


REFERENCE_ENGINE = "reference"


def quality_steps(config: BenchConfig) -> int:
    """Progress steps the section reports: engines ready, then one per wave."""
    questions = min(config.quality_questions, len(load_qa_set()))
    return 1 + -(-questions // WAVE)


def _engines(loaded: LoadedModel, settings: Sequence[QualitySetting]) -> dict[str, Engine]:
    needed = {s.engine for s in settings} | {REFERENCE_ENGINE}
    models = {"float32": loaded}
    if any(ENGINE_OPTIONS[key][0] == "bfloat16" for key in needed):
        models["bfloat16"] = load_model(loaded.model_id, dtype="bfloat16")
    engines = {}
    for key in sorted(needed):
        dtype, options = ENGINE_OPTIONS[key]
        model = models[dtype]
        streams = any(s.engine == key and s.namespace is not None for s in settings) or key == WARM
        cfg = EngineConfig(
            model=model.model_id,
            cache_bytes=UNBOUNDED if streams else FRESH_BYTES,
            batch_invariant=True,
            max_running=64,
            **options,
        )
        engines[key] = Engine(model.model, model.tokenizer, model_id=model.model_id, config=cfg)
        warm_up_engine(engines[key])
    return engines


def _run_order(settings: Sequence[QualitySetting]) -> list[QualitySetting]:
    """The reference first (the others are scored on its answers); in a namespace that chunks-mode rows
    share with an exact row, the chunks-mode rows before it: an exact row's prompts enter the cache,
    and a later stitched prefill of the same question would find them there whole."""
    return sorted(settings, key=lambda s: (s.name != REFERENCE, isinstance(s.reuse, str)))


def _waves(n: int) -> list[list[int]]:
    return [list(range(i, min(i + WAVE, n))) for i in range(0, n, WAVE)]


def _runs(setting: QualitySetting, in_matrix: bool, r: RankedItem) -> bool:
    return (in_matrix or not setting.matrix) and (r.item.kind == "corpus" or setting.rerank is None)


def _job(
    engine: Engine,
    asm: dict[str, PromptAssembler],
    r: RankedItem,
    setting: QualitySetting,
    reference: SettingOutcomes,
    n: int,
    config: BenchConfig,
) -> Job:
    namespace = setting.namespace or f"{setting.name}-{n}"  # None: fresh, nothing to reuse
    assembler = asm[setting.order]
    probe = (lambda ids: engine.cached_prefix_length(ids, namespace)) if setting.order == "cache" else None
    ref = reference.by_item.get(n)
    positions = config.quality_kl_positions
    return Job(
        engine,
        lambda: assembler.assemble(r.item.question, r.hits, prefix_probe=probe),
        {"namespace": namespace, "reuse": setting.reuse},
        ref.token_ids[:positions] if ref is not None else [],
        batch_scoring=not isinstance(setting.reuse, str),
        score_own=positions if setting.name == REFERENCE else 0,
    )


def _outcome(r: RankedItem, job: Job, ref: Outcome | None, config: BenchConfig) -> Outcome:
    result, scores = job.result, job.scores
    assert result is not None and job.built is not None
    k = config.quality_agreement_tokens
    reference_ids = ref.token_ids if ref is not None else result.token_ids
    kl = None
    if ref is None:
        kl = 0.0  # the reference itself
    elif scores is not None and ref.scores is not None:
        kl = statistics.fmean(kl_divergence(a, b) for a, b in zip(ref.scores, scores))
    return Outcome(
        correct=is_correct(result.text, r.item.answers),
        agree=result.token_ids[:k] == reference_ids[:k],
        exact=result.token_ids == reference_ids,
        kl=kl,
        ttft_s=result.prefill_s,
        prompt_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens,
        stitched_tokens=result.stitched_tokens,
        recomputed_tokens=result.recomputed_tokens,
        deviation=getattr(result, "stitch_deviation", None),
        text=result.text,
        token_ids=list(result.token_ids),
        scores=scores if ref is None else None,
        prompt_hash=hash(tuple(job.built.token_ids)),
    )


def _describe(s: QualitySetting) -> dict[str, Any]:
    reuse = s.reuse if isinstance(s.reuse, str) else "chunks"
    setting = None if isinstance(s.reuse, str) else s.reuse.label
    return {
        "group": s.group,
        "order": s.order,
        "reuse": reuse,
        "setting": setting,
        "matrix": s.matrix,
        "cache": "fresh namespace per question" if s.namespace is None else s.namespace,
        "default_chunks": s.reuse == ChunkReuse(),
        "rerank": s.rerank,
    }
