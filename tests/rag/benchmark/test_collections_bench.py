"""`prefixrag bench-collections` at a small size: every method finds the exact neighbours of the allowed
rows, per-collection search never reads another collection, and the report is written."""

from __future__ import annotations

import json

import pytest

from rag.benchmark.collections import CollectionsBenchConfig, run_collections_bench
from rag.benchmark.collections_report import collections_report


def test_small_run_is_exact_where_it_must_be(tmp_path):
    config = CollectionsBenchConfig(
        chunks=3_000,
        collections=6,
        dim=32,
        queries=24,
        hnsw_threshold=2_000,
        words_per_text=12,
        vocabulary=500,
    )
    results = run_collections_bench(config, progress=lambda _: None)
    assert results["shared_index_kind"] == "hnsw"  # the shared index crossed the graph threshold
    dense = {(r["method"], r["scope"]): r for r in results["dense"]}
    assert {m for m, _ in dense} == {
        "per-collection",
        "shared flat, post-filter",
        "shared flat, IDSelector",
        "shared HNSW, post-filter",
        "shared HNSW, IDSelector",
    }
    for scope in ("own", "own+shared"):
        for method in ("per-collection", "shared flat, post-filter", "shared flat, IDSelector"):
            assert dense[method, scope]["recall"] == 1.0, (method, scope)  # exact searches
        assert dense["per-collection", scope]["queries"] == 12
    assert {(r["method"], r["scope"]) for r in results["bm25"]} == {
        (m, s) for m in ("per-collection", "shared, scores filtered") for s in ("own", "own+shared")
    }
    report = collections_report(results, "prefixrag bench-collections --chunks 3000")
    assert "| per-collection | own |" in report and "## BM25" in report
    json.dumps(results)  # the results file is plain JSON


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="collections"):
        CollectionsBenchConfig(collections=1)
    with pytest.raises(ValueError, match="positive"):
        CollectionsBenchConfig(queries=0)
