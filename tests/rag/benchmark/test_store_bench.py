"""The document-store section of `prefixrag bench-collections` at a small size: both stores ingest
and reload every chunk, a follower sees every write, the report is written. How soon it sees them is
the benchmark's figure (a loaded machine takes longer), not a bound checked here."""

from __future__ import annotations

from rag.benchmark.collections_report import store_section
from rag.benchmark.store_bench import StoreBenchConfig, run_store_bench


def test_small_run_measures_both_stores(postgres_url):
    config = StoreBenchConfig(
        chunks=600, collections=3, chunks_per_doc=5, dim=16, docs_per_write=10, follow_writes=20,
        write_rate_hz=40, queries=20,
    )  # fmt: skip
    results = run_store_bench(config, postgres_url, progress=lambda _: None)
    for store in ("local", "postgresql"):
        assert results["ingest"][store]["chunks"] == 600 and results["ingest"][store]["chunks_per_s"] > 0
        assert results["catch_up"][store]["chunks"] == 600  # a new replica holds everything
    follow = results["follow"]
    assert follow["writes"] == 20 and follow["missing"] == 0, follow
    assert follow["latency_ms"]["n"] == 20, follow  # every write's follow latency was timed
    assert set(results["search"]) == {"local index", "postgresql follower"}
    report = store_section(results)
    assert "| ingest, chunks/s |" in report and "| PostgreSQL, another replica |" in report
