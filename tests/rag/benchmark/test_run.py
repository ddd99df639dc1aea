"""`prefixrag bench` end to end on a tiny configuration (same code path as --quick), then the files'
internal consistency: hit rates within the oracle, caching off at zero, capacity monotone, the real
engine equal to the simulation, every plot in the report."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os

import pytest

from rag.benchmark import BenchConfig, run_benchmark
from rag.benchmark.limits import bfloat16_not_run
from rag.benchmark.plots import PLOTS
from rag.benchmark.redis_server import redis_server_binary
from rag.benchmark.report import ENGINE_TITLE, RADIX_TITLE, rerender
from rag.ingestion.chunking import Chunker
from rag.ingestion.loaders import load_python_reference
from rag.knowledge_base import KnowledgeBase

TOPICS = 5
NOT_RUN = bfloat16_not_run()  # why bfloat16 rows do not run on this CPU (None: they run)

TINY = BenchConfig.quick_run(
    requests=6,
    topics=TOPICS,
    top_k=1,
    skews=(0.5, 1.0),
    capacities=(0.0, 0.25, 1.0),
    measured=(("cache", 1.0, "lru"), ("relevance", 0.25, "gdsf")),
    baseline_samples=2,
    transformers_samples=1,
    tpot_prompts=1,
    tpot_tokens=3,
    engine_repeats=1,
    engine_decode_tokens=3,
    engine_context_tokens=160,
    engine_batch_sizes=(1, 2),
    engine_bfloat16=True,
    radix_requests=40,
    radix_levels=(3000,),
    steady_factor=3,
    kv_disk_dtypes=("int8",),
    kv_fidelity_prompts=1,
    kv_fidelity_tokens=3,
    kv_break_even_lengths=(64, 128),
    kv_zero_hit_requests=2,
    kv_remote=True,
    weights_repeats=1,
    weights_answer_tokens=4,
    fidelity_prompts=2,
    fidelity_answer_tokens=4,
    fidelity_corpus_tokens=64,
    chunks_requests=2,
    chunks_fidelity_prompts=1,
    chunks_answer_tokens=4,
    chunks_kl_positions=2,
    quality_questions=1,
    quality_matrix_questions=1,
    quality_answer_tokens=6,
    quality_kl_positions=2,
    quality_budgets=(0.2,),
    quality_strategies=("none", "first_tail"),
    quality_reranker=True,
    retrieval_section=True,
    retrieval_scale_chunks=500,
    exactness_section=False,  # tests/rag/benchmark/test_exactness_section.py runs it
    retrieval_timed_questions=3,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory, loaded_model, embedder, llm_tokenizer):
    kb = KnowledgeBase(embedder=embedder, chunker=Chunker(llm_tokenizer, 96, 16))
    kb.add_documents(load_python_reference()[:TOPICS])
    out = tmp_path_factory.mktemp("bench")
    results = run_benchmark(TINY, out, loaded=loaded_model, knowledge_base=kb, command="pytest")
    return out, results


def test_writes_every_file(run):
    out, _ = run
    names = {p.name for p in out.iterdir()}
    assert {"results.json", "results.csv", "report.md", *PLOTS} <= names
    for name in PLOTS:
        assert (out / name).stat().st_size > 10_000  # a real figure, not an empty canvas


def test_report_embeds_every_plot_and_states_the_figures(run):
    out, results = run
    report = (out / "report.md").read_text()
    for name in PLOTS:
        assert f"]({name})" in report
    for heading in (
        "## Headline",
        "## Targets",
        f"## {ENGINE_TITLE}",
        "## int8 weights",
        f"## {RADIX_TITLE}",
        "## KV tiers",
        "## Retrieval: methods on held-out questions",
        "## Method",
    ):
        assert heading in report
    assert results["meta"]["date"][:4] in report and "cores" in report
    assert "llama.cpp" in report


def test_report_can_be_redrawn_from_the_json(run):
    out, _ = run
    before = (out / "report.md").read_text()
    rerender(out)
    assert (out / "report.md").read_text() == before


def test_json_and_csv_agree(run):
    out, results = run
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["requests"] == TINY.requests
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == len(results["sweep"]) + len(results["measured"])
    measured = {r["config"]: r for r in rows if r["source"] == "measured"}
    assert set(measured) == set(results["measured"])


def test_hit_rates_never_exceed_the_oracle(run):
    _, results = run
    for r in results["sweep"]:
        assert r["token_hit_rate"] <= r["oracle_hit_rate"] + 1e-12, r["config"]
        assert 0 <= r["of_oracle"] <= 1 + 1e-12


def test_caching_off_hits_nothing(run):
    _, results = run
    off = [r for r in results["sweep"] if r["capacity_share"] == 0]
    assert off and all(r["token_hit_rate"] == 0 and r["request_hit_rate"] == 0 for r in off)
    assert results["measured"]["caching off"]["token_hit_rate"] == 0


def test_more_capacity_never_lowers_the_normalised_hit_rate(run):
    _, results = run
    assert results["checks"]["capacity_monotone_violations"] == []
    groups: dict[tuple, list] = {}
    for r in results["sweep"]:
        groups.setdefault((r["order"], r["eviction"], r["skew"]), []).append(r)
    for rows in groups.values():
        rows.sort(key=lambda r: r["capacity_share"])
        for lo, hi in itertools.pairwise(rows):
            assert hi["of_oracle"] >= lo["of_oracle"] - 0.01


def test_unbounded_capacity_reaches_the_oracle(run):
    _, results = run
    for r in results["sweep"]:
        if r["capacity_share"] == 1.0:
            assert r["token_hit_rate"] == pytest.approx(r["oracle_hit_rate"])


def test_real_engine_equals_the_simulation(run):
    _, results = run
    engines = {n: m for n, m in results["measured"].items() if m["kind"] == "engine"}
    assert len(engines) == 2
    for m in engines.values():
        assert m["requests"] == TINY.requests
        assert m["prompts_match"] and m["simulation_matches"], m["simulation_mismatches"]
        assert m["token_hit_rate"] == pytest.approx(m["simulated_token_hit_rate"])
        assert m["observed_bytes_per_token"] == results["workload"]["bytes_per_token"]
    assert results["headline"]["all_match"]


def test_fit_targets_and_sections(run):
    _, results = run
    fit = results["fit"]
    assert fit["n"] >= TINY.requests * 2 and fit["b"] > 0 and math.isfinite(fit["a"])
    assert len(results["targets"]) == 3 and all(isinstance(t["met"], bool) for t in results["targets"])
    ttft = results["engine_section"]["ttft"]
    assert ttft["cold_s"] > 0
    # at 0% hits the cache did real work (an insert of the whole prompt), a small share of cold TTFT
    assert 0 < ttft["zero_hit_cache_s"] < ttft["cold_s"] and ttft["zero_hit_cache_share"] < 1
    dtypes = results["engine_section"]["dtypes"]  # float32 against bfloat16, side by side
    if NOT_RUN:  # a CPU without bfloat16 matmuls: not run, and the report says why
        assert dtypes["not_run"] == NOT_RUN
        assert f"float32 against bfloat16: {NOT_RUN}" in (run[0] / "report.md").read_text()
    else:
        for dtype in ("float32", "bfloat16"):
            assert dtypes[dtype]["cold_s"] > dtypes[dtype]["warm_s"] > 0
            assert dtypes[dtype]["decode_ms_per_token"] > 0
    assert set(dtypes["cpu"]) == {"avx512_bf16", "amx_bf16"}
    assert "3000" in results["radix_section"]["results"]["lru"]
    assert results["baselines"]["llama_cpp"]["note"]
    assert set(results["ttft_samples"]) == set(results["measured"])
    retrieval = results["retrieval_section"]
    assert retrieval["methods"]["split"] == "heldout" and retrieval["scale"]["spec"]["chunks"] == 500


def test_ratios_compare_the_same_requests(run):
    """Caching off and transformers run on a sample of the stream: every ratio with them is taken on
    the requests both sides ran, and their turns rotate within a round like the engines'."""
    _, results = run
    measured, samples = results["measured"], results["ttft_samples"]
    off, hf = measured["caching off"], measured["transformers generate"]
    assert set(hf["indices"]) <= set(off["indices"]) and 0 < len(off["indices"]) < TINY.requests
    for name, m in measured.items():
        at = dict(zip(m["indices"], samples[name]))
        pairs = [(at[i], t) for i, t in zip(off["indices"], samples["caching off"]) if i in at]
        assert m["vs_off"]["requests"] == len(pairs) > 0
        expected = sum(t for _, t in pairs) / sum(t for t, _ in pairs)
        assert m["speedup_vs_off_mean"] == pytest.approx(expected)
    ref = measured[results["headline"]["reference_name"]]
    vs_hf = results["headline"]["vs_transformers"]
    at = dict(zip(ref["indices"], samples[results["headline"]["reference_name"]]))
    assert vs_hf["ttft_s"]["mean"] == pytest.approx(sum(at[i] for i in hf["indices"]) / len(hf["indices"]))
    assert max(off["places"]) > min(off["places"])  # not always after the cached engines
    for m in measured.values():
        assert len(m["places"]) == m["requests"]


def test_report_names_targets_by_what_they_measure(run):
    out, _ = run
    report = (out / "report.md").read_text()
    assert "issue" not in report.lower()
    assert "median of 1 runs" in report and "vs off, same requests" in report


def test_steady_state_continues_the_measured_stream(run):
    _, results = run
    steady = results["steady_state"]
    assert steady["requests"] == 3 * TINY.requests and steady["window"] == TINY.requests
    for part in ("cold", "warm"):
        figures = steady[part]
        assert 0 <= figures["token_hit_rate"] <= figures["oracle_hit_rate"] + 1e-9 <= 1
        assert math.isfinite(
            figures["modelled_speedup"]
        )  # from the fit, whose sign a tiny run can't vouch for
    # the first window is the measured stream itself: same hit rate as the measured reference
    reference = results["headline"]["reference"]
    assert steady["cold"]["token_hit_rate"] == pytest.approx(reference["token_hit_rate"])
    # with an unbounded cache, later requests can only find more of their prompt cached
    assert steady["warm"]["oracle_hit_rate"] >= steady["cold"]["oracle_hit_rate"]


def test_kv_tiers_section(run):
    _, results = run
    kv = results["kv_section"]
    assert kv["bytes_per_token"] == {"float32": 46_080, "bfloat16": 23_040, "float16": 23_040, "int8": 11_880}
    fid = kv["fidelity"]
    assert fid["float32"]["mean_kl"] == 0.0
    for name in ("bfloat16", "float16", "int8"):
        assert 0 < fid[name]["mean_kl"] <= fid[name]["max_kl"] and 0 <= fid[name]["greedy_agreement"] <= 1
    disk = kv["disk_ttft"]["int8"]
    assert (
        # from disk after a restart: all but the last token; from RAM, all of it with its saved logits
        disk["cached_disk"] == disk["prompt_tokens"] - 1 and disk["cached_ram"] == disk["prompt_tokens"]
    )
    assert disk["disk_s"] > 0 and 0 < disk["ram_s"] < disk["cold_s"] and disk["read_mb_s"] > 0
    assert [r["tokens"] for r in kv["break_even"]["rows"]] == [64, 128]
    assert kv["zero_hit"]["written_mb"] > 0
    assert kv["working_set"]["tokens"] > 0
    assert kv["targets"] and all(isinstance(t["met"], bool) for t in kv["targets"])


def test_kv_remote_tier_section(run):
    """Replica B through Redis, the restart case, break-even and 0% hits; where redis-server is absent
    (never under CI=true) one line says so."""
    out, results = run
    remote = results["kv_section"]["remote"]
    report = (out / "report.md").read_text()
    if redis_server_binary() is None and os.environ.get("CI") != "true":
        assert not remote["available"] and "Remote tier (Redis): not measured: redis-server" in report
        return
    assert remote["available"] and "Remote tier (Redis " in report
    rep, rs = remote["replica"], remote["restart"]
    assert rep["cached_remote"] == rep["prompt_tokens"] - 1 and 0 < rep["remote_first_s"] < rep["cold_s"]
    assert rep["read_mb_s"] > 0 and rep["write_mb_s"] > 0
    # the system prompt ends inside a block: every tier reuses it to its last token, as RAM does
    assert rs["system_tokens"] % 64 and rs["cached_disk"] >= rs["system_tokens"] <= rs["cached_remote"]
    assert rs["cached_ram"] >= rs["system_tokens"]
    assert [r["tokens"] for r in remote["break_even"]["rows"]] == [64, 128]
    assert remote["zero_hit"]["written_mb"] > 0
    names = {t["target"] for t in results["kv_section"]["targets"]}
    assert any("through Redis" in n for n in names) and any("restart" in n for n in names)


def test_weights_section_compares_int8_float32_and_llama_cpp(run):
    out, results = run
    sec = results["weights_section"]
    systems = sec["systems"]
    assert {"float32", "int8"} <= set(systems) and ("llama.cpp" in systems) == results["baselines"][
        "llama_cpp"
    ]["available"]
    for name, s in systems.items():
        assert s["cold_ttft_s"] > 0 and s["warm_ttft_s"] > 0 and s["decode_ms_per_token"] > 0, name
        assert s["answer_tokens"] == TINY.weights_answer_tokens and s["cold_cached_tokens"] == 0, name
        assert s["warm_cached_tokens"] > 0, name  # the shared context was reused, by each system's own count
        assert s["kv_bytes_per_cached_prompt"] > 0 and s["weight_bytes"] > 0, name
    assert set(systems["int8"]["batched_decode"]) == {"1", "2"} and "batched_decode" not in systems.get(
        "llama.cpp", {}
    )
    assert systems["int8"]["weight_bytes"] < systems["float32"]["weight_bytes"]
    fid = sec["fidelity"]
    assert fid["prompts"] == 2 and fid["float32"]["perplexity"] > 1
    candidates = ("int8",) if NOT_RUN else ("int8", "bfloat16")
    for name in candidates:
        assert 0 <= fid[name]["greedy_agreement"] <= 1 and 0 <= fid[name]["kl_mean"] <= fid[name]["kl_max"]
        assert (
            0 <= fid[name]["agreed_tokens_mean"] <= TINY.fidelity_answer_tokens
            and fid[name]["perplexity"] > 1
        )
    report = (out / "report.md").read_text()
    assert "| target | measured | met |" in report and all(f"| {name} |" in report for name in candidates)
    if NOT_RUN:
        assert "bfloat16" not in fid and f"bfloat16: {NOT_RUN}." in report


def test_chunks_section_measures_every_mode_and_setting(run):
    out, results = run
    section = results["chunks_section"]
    assert section["settings"][0] == "none" and section["default"] in section["settings"]
    ttft = section["ttft"]
    assert {"caching off", "exact prefix"} <= set(ttft)
    assert {f"chunks warm, {label}" for label in section["settings"]} <= set(ttft)
    for name, m in ttft.items():
        assert (
            m["requests"] >= (1 if name == "caching off" else section["requests"]) and m["ttft_s"]["mean"] > 0
        )
        assert 0 <= m["exact_share"] <= m["reuse_share"] <= 1
    assert ttft["caching off"]["reuse_share"] == 0
    assert ttft["exact prefix"]["reuse_share"] == ttft["exact prefix"]["exact_share"]  # nothing stitched
    assert ttft["chunks warm, none"]["recomputed_of_stitched"] == 0
    for label, f in section["fidelity"].items():
        assert f["prompts"] == 1 and f["kl_mean"] >= -1e-6, label  # KL >= 0 up to rounding
        assert 0 <= f["rouge_l"] <= 1 and f["first_token_agreement"] in (0.0, 1.0)
    report = (out / "report.md").read_text()
    assert "## Chunk reuse beyond the prefix" in report
    assert report.count("| chunks warm, ") == len(section["settings"])
    assert "### Targets at" in report


def test_quality_section_scores_every_setting_against_full_prefill(run):
    """Every row on its questions, full prefill agreeing with itself, exact modes giving full prefill's
    answers wherever their prompt was full prefill's, and a report row per setting."""
    out, results = run
    section = results["quality_section"]
    rows = section["settings"]
    ref = rows["full prefill"]
    assert (
        ref["questions"] == section["questions"] == TINY.quality_questions
        and section["matrix_questions"] == 1
    )
    assert ref["agreement"] == ref["exact"] == 1.0 and ref["kl_mean"] == 0.0
    assert {"order", "chunks", "weights", "kv", "retrieval"} <= {r["group"] for r in rows.values()}
    for name, row in rows.items():
        if row["group"] == "retrieval":  # every corpus question, only those
            assert row["questions"] == section["kinds"]["corpus"], name
            continue
        assert row["questions"] == (1 if row["matrix"] else TINY.quality_questions), name
        lo, hi = row["accuracy_ci"]
        assert 0 <= lo <= row["accuracy"] <= hi <= 1 and row["ttft_s_mean"] > 0, name
        assert row["kl_mean"] >= -1e-6 and 0 <= row["hit_rate"] <= row["reuse_share"] <= 1, name
        if row["reuse"] == "prefix" and row["same_prompt_questions"]:  # exact reuse: the same answers
            assert row["same_prompt_equal"] == 1.0, name
    chunks = [r for r in rows.values() if r["reuse"] == "chunks"]
    assert [r["setting"] for r in chunks] == ["none", "first_tail 20%"]
    assert all(r["reuse_share"] > r["hit_rate"] for r in chunks)  # stitched chunks on top of the prefix
    assert rows["prefix, cache order, after warm()"]["hit_rate"] > 0  # warmed placements reused
    report = (out / "report.md").read_text()
    assert "## Answer quality on the QA set" in report
    if NOT_RUN:  # bfloat16 weights: not run on a CPU that emulates them, and the report says why
        assert "bfloat16 weights" not in rows
        assert section["not_run"] == {"bfloat16 weights": NOT_RUN}
        assert f"Row 'bfloat16 weights': {NOT_RUN}." in report
    else:
        assert "bfloat16 weights" in rows and not section["not_run"]
    for name, row in rows.items():
        if row["questions"]:
            assert f"| {name}" in report, name
