"""`prefixrag bench` end to end on a tiny configuration (same code path as --quick), then the files'
internal consistency: hit rates within the oracle, caching off at zero, capacity monotone, the real
engine equal to the simulation, every plot in the report."""

from __future__ import annotations

import csv
import itertools
import json
import math

import pytest

from rag.benchmark import BenchConfig, run_benchmark
from rag.benchmark.plots import PLOTS
from rag.benchmark.report import rerender
from rag.ingestion.chunking import Chunker
from rag.ingestion.loaders import load_python_reference
from rag.ingestion.store import KnowledgeBase

TOPICS = 5

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
    radix_requests=40,
    radix_levels=(3000,),
    steady_factor=3,
    retrieval_section=True,
    retrieval_scale_chunks=500,
    retrieval_timed_questions=3,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory, loaded_model, embedder, llm_tokenizer):
    kb = KnowledgeBase(embedder=embedder, chunker=Chunker(llm_tokenizer))
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
        "## Engine section",
        "## Radix section",
        "## Retrieval section",
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
    assert "3000" in results["radix_section"]["results"]["lru"]
    assert results["baselines"]["llama_cpp"]["note"]
    assert set(results["ttft_samples"]) == set(results["measured"])
    retrieval = results["retrieval_section"]
    assert retrieval["methods"]["split"] == "heldout" and retrieval["scale"]["spec"]["chunks"] == 500


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
