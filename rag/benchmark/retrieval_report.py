"""The benchmark report's retrieval section, rendered from results.json.

Example:
    >>> retrieval_section({"retrieval_section": None}).splitlines()[0]
    '## Retrieval: methods on held-out questions, ANN at scale'
"""

from __future__ import annotations

from typing import Any

KIND_ORDER = ("keyword", "paraphrase", "howto")


def retrieval_section(res: dict[str, Any]) -> str:
    """Methods on the held-out split with intervals, latency, the synthetic scale run, the targets."""
    section = res.get("retrieval_section")
    if not section:
        return "## Retrieval: methods on held-out questions, ANN at scale\n\nNot run (`--no-retrieval-section`, or `--quick`)."
    methods, scale = section["methods"], section["scale"]
    return "\n".join(
        [
            "## Retrieval: methods on held-out questions, ANN at scale",
            "",
            _intro(methods),
            "",
            *_methods_table(methods),
            "",
            *_latency_table(methods),
            "",
            *_scale_lines(scale),
            "",
            *_targets_table([*methods["targets"], *scale["targets"]]),
        ]
    )


def _intro(m: dict[str, Any]) -> str:
    kinds = ", ".join(f"{m['kinds'].get(k, 0)} {k}" for k in KIND_ORDER)
    knobs = ", ".join(f"{k}={v}" for k, v in m["config"].items())
    return (
        f"The {m['questions']} questions of the `{m['split']}` split of `rag/data/retrieval_eval.json` "
        f"({kinds}), written from the corpus without looking at any retriever's output; every knob was "
        f"chosen on the `tune` split only. {m['chunks']} chunks. recall@k: a chunk of a relevant topic "
        "among the top k; MRR: of the first such chunk; [95% bootstrap interval over questions]. "
        "docs@4: distinct documents in the top 4; coverage@4: share of the relevant topics among them "
        "(of as many as 4 slots hold); tokens@4: LLM tokens the top 4 put in the prompt. "
        f"Default: {knobs}."
    )


def _methods_table(m: dict[str, Any]) -> list[str]:
    rows = [
        "| method | recall@1 | recall@4 | recall@10 | MRR | recall@4 keyword / paraphrase / how-to "
        "| docs@4 | coverage@4 | tokens@4 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in m["rows"]:
        ci = r["intervals"]
        kinds = " / ".join(f"{r['recall4_by_kind'][k]:.2f}" for k in KIND_ORDER if k in r["recall4_by_kind"])
        rows.append(
            f"| {r['name']} | {_ci(r['recall']['1'], ci['recall@1'])} | {_ci(r['recall']['4'], ci['recall@4'])} "
            f"| {r['recall']['10']:.3f} | {_ci(r['mrr'], ci['mrr'])} | {kinds} | {r['documents4']:.2f} "
            f"| {r['coverage4']:.3f} | {r['context_tokens4']:.0f} |"
        )
    return rows


def _latency_table(m: dict[str, Any]) -> list[str]:
    rows = [
        f"Retrieval time per query at top-4 over the {m['chunks']} chunks, query embedding included "
        "(the embedding reranker over the window vectors the index keeps from ingestion, with the "
        "first stage it reranks timed beside it):",
        "",
        "| method | queries | p50 ms | p95 ms | of which: query embedding p50 | search p50 |",
        "|---|---|---|---|---|---|",
    ]
    for name, t in m["latency_ms"].items():
        rows.append(
            f"| {name} | {t['queries']} | {t['p50']:.1f} | {t['p95']:.1f} | {t['embed_p50']:.1f} "
            f"| {t['search_p50']:.1f} |"
        )
    return rows


def _scale_lines(s: dict[str, Any]) -> list[str]:
    spec, b = s["spec"], s["build_s"]
    rows = [
        f"Synthetic scale run: {spec['chunks']:,} chunks shaped like the corpus's (each vector a real chunk "
        f"vector plus up to {spec['mix']:g} of another plus Gaussian noise, each text {100 * spec['keep_words']:.0f}% "
        f"of a real chunk's words), queried with the split's real questions. HNSW M={spec['hnsw_m']}, "
        f"efConstruction={spec['ef_construction']}: built in {b['hnsw_s']:.0f} s (flat {b['flat_s']:.1f} s, "
        f"BM25 {b['bm25_s']:.0f} s). ANN recall@{spec['recall_k']} against exact (flat) search:",
        "",
        "| ef_search | recall vs exact | search p50 ms |",
        "|---|---|---|",
    ]
    for p in s["ef_sweep"]:
        rows.append(f"| {p['ef_search']} | {p['recall']:.3f} | {p['search_ms_p50']:.2f} |")
    hnsw, flat = s["latency_ms"]["hnsw"], s["latency_ms"]["flat"]
    rows += [
        "",
        f"The {s['retriever']} retriever at top-{spec['top_k']} with ef_search {s['ef_search']} (the "
        f"index's default, recall {s['recall']:.3f}): "
        f"p50 {hnsw['p50']:.1f} ms, p95 {hnsw['p95']:.1f} ms per query, query embedding included (of which "
        f"embedding p50 {hnsw['embed_p50']:.1f} ms, search p50 {hnsw['search_p50']:.1f} ms); exact flat "
        f"search instead: p50 {flat['p50']:.1f} ms (search p50 {flat['search_p50']:.1f} ms).",
    ]
    return rows


def _targets_table(targets: list[dict[str, Any]]) -> list[str]:
    rows = ["| target | value | met |", "|---|---|---|"]
    rows += [f"| {t['target']} | {t['value']} | {'met' if t['met'] else '**missed**'} |" for t in targets]
    return rows


def _ci(value: float, interval: list[float]) -> str:
    return f"{value:.3f} [{interval[0]:.2f}, {interval[1]:.2f}]"
