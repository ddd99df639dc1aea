"""Markdown report of `prefixrag bench-collections` (``rag.benchmark.collections``)."""

from __future__ import annotations

from typing import Any


def collections_table(rows: list[dict[str, Any]], baseline: str = "per-collection") -> str:
    """One row per (method, scope): p50/p95/mean latency, its ratio to ``baseline``'s p50, recall@k.

    >>> rows = [{"method": "per-collection", "scope": "own", "p50_ms": 0.5, "p95_ms": 0.7, "mean_ms": 0.55,
    ...          "recall": 1.0, "queries": 10},
    ...         {"method": "shared", "scope": "own", "p50_ms": 5.0, "p95_ms": 6.0, "mean_ms": 5.1,
    ...          "recall": 0.9, "queries": 10}]
    >>> print(collections_table(rows).splitlines()[3])
    | shared | own | 5.000 | 6.000 | 5.100 | 10.0x | 0.900 | 10 |
    """
    base = {r["scope"]: r["p50_ms"] for r in rows if r["method"] == baseline}
    lines = [
        "| method | collections read | p50 ms | p95 ms | mean ms | p50 vs per-collection | recall@k | queries |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["scope"], r["method"] != baseline, r["p50_ms"])):
        ratio = f"{r['p50_ms'] / base[r['scope']]:.1f}x" if base.get(r["scope"]) else "-"
        recall = "-" if r["recall"] is None else f"{r['recall']:.3f}"
        lines.append(
            f"| {r['method']} | {r['scope']} | {r['p50_ms']:.3f} | {r['p95_ms']:.3f} | {r['mean_ms']:.3f} "
            f"| {ratio} | {recall} | {r['queries']} |"
        )
    return "\n".join(lines)


def collections_report(results: dict[str, Any], command: str) -> str:
    """The whole report: setup, the dense table, the BM25 table."""
    c = results["config"]
    per = c["chunks"] // c["collections"]
    build = ", ".join(f"{name} {s:.1f} s" for name, s in results["build_s"].items())
    parts = [
        "# Collections at scale: per-collection indexes vs one shared index",
        "",
        f"`{command}`: {c['chunks']:,} chunks ({c['dim']}-dim unit vectors, synthetic) in {c['collections']} "
        f"collections of {per:,}; {c['queries']} queries, top {c['top_k']}, half reading the tenant's own "
        "collection, half its own plus the shared one. Every method answers every query in a rotating "
        "order (side by side, one process); recall is against an exact search of the allowed rows. "
        f"FAISS threads: {results['faiss_threads']}; the shared index is `{results['shared_index_kind']}` "
        f"at this size. Index builds: {build}.",
        "",
        "## Dense (FAISS)",
        "",
        collections_table(results["dense"]),
        "",
        "Per-collection indexes below `hnsw_threshold` are exact and read only the tenant's rows. Random "
        "vectors have no neighbourhood structure, the hardest case for a graph index: the shared HNSW "
        "rows' recall is a property of these data, and a filter cannot raise it. A post-filter has to "
        "fetch about as many hits as there are collections per hit it keeps.",
    ]
    if "bm25" in results:
        parts += [
            "",
            f"## BM25 ({c['words_per_text']} Zipf words per text, {c['vocabulary']:,}-word vocabulary, "
            "3-word queries)",
            "",
            collections_table(results["bm25"]),
        ]
    if "store" in results:
        parts += ["", store_section(results["store"])]
    return "\n".join(parts) + "\n"


def store_section(store: dict[str, Any]) -> str:
    """The document stores' figures (``rag.benchmark.store_bench``), or why they were not measured.

    >>> print(store_section({"skipped": "no PostgreSQL here"}))
    ## Document stores: the local index directory vs PostgreSQL shared by replicas
    <BLANKLINE>
    Not measured: no PostgreSQL here.
    """
    title = "## Document stores: the local index directory vs PostgreSQL shared by replicas"
    if "skipped" in store:
        return f"{title}\n\nNot measured: {store['skipped']}."
    c, ingest, catch, follow = store["config"], store["ingest"], store["catch_up"], store["follow"]
    lines = [
        title,
        "",
        f"{c['chunks']:,} chunks ({c['dim']}-dim synthetic unit vectors, {c['chunks_per_doc']} per document) "
        f"in {c['collections']} collections, {c['docs_per_write']} documents per write. Catch-up: a new "
        "replica opening the store until every chunk is in its FAISS and BM25 indexes. Follow: "
        f"{follow['writes']} single-document writes at {c['write_rate_hz']:g}/s through one replica, "
        "from the writer's acknowledgement until the document is in another replica's indexes.",
        "",
        "| | local index directory | PostgreSQL |",
        "|---|---:|---:|",
        f"| ingest, chunks/s | {ingest['local']['chunks_per_s']:,.0f} | {ingest['postgresql']['chunks_per_s']:,.0f} |",
        f"| ingest, ms per write (p50) | {ingest['local']['write_ms']['p50']:.1f} | "
        f"{ingest['postgresql']['write_ms']['p50']:.1f} |",
        f"| catch-up of a new replica, s | {catch['local']['seconds']:.2f} | {catch['postgresql']['seconds']:.2f} |",
        f"| chunks loaded | {catch['local']['chunks']:,} | {catch['postgresql']['chunks']:,} |",
        "",
        "| follow latency | p50 ms | p95 ms | max ms | missing |",
        "|---|---:|---:|---:|---:|",
        f"| PostgreSQL, another replica | {follow['latency_ms']['p50']:.1f} | {follow['latency_ms']['p95']:.1f} "
        f"| {follow['latency_ms']['max']:.1f} | {follow['missing']} |",
        "",
        f"| dense search of one collection (top {c['top_k']}) | p50 ms | p95 ms |",
        "|---|---:|---:|",
    ]
    for name, t in store["search"].items():
        lines.append(f"| {name} | {t['p50']:.3f} | {t['p95']:.3f} |")
    during = follow["search_during_ms"]
    lines.append(
        f"| postgresql follower, while following the writes | {during['p50']:.3f} | {during['p95']:.3f} |"
    )
    lines += [
        "",
        "Search runs on the same in-memory FAISS whichever store filled it; the local directory saves "
        "a new version per write (its changed collection rewritten), PostgreSQL commits one transaction.",
    ]
    return "\n".join(lines)
