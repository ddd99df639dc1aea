"""Write a run's results: ``results.json``, ``results.csv`` and ``report.md`` (which embeds the plots).

Example:
    >>> write_outputs(results, Path("bench-results"))     # doctest: +SKIP
    [PosixPath('bench-results/results.json'), ...]
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag.benchmark.chunks_report import chunks_markdown
from rag.benchmark.exactness_report import exactness_markdown
from rag.benchmark.kv_remote_report import remote_rows
from rag.benchmark.measure import OFF, TRANSFORMERS
from rag.benchmark.plots import PLOTS, draw_all
from rag.benchmark.quality_report import quality_markdown
from rag.benchmark.retrieval_report import retrieval_section
from rag.benchmark.weights_report import weights_markdown

ENGINE_TITLE = "Engine: cold vs warm TTFT, 0%-hit overhead, decode"
RADIX_TITLE = "Radix tree alone: match and insert cost"

CSV_COLUMNS = [
    "config",
    "source",
    "order",
    "capacity_share",
    "capacity_mib",
    "eviction",
    "skew",
    "requests",
    "token_hit_rate",
    "oracle_hit_rate",
    "of_oracle",
    "request_hit_rate",
    "context_hit_rate",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "tpot_ms",
    "throughput_tok_s",
    "speedup_vs_off",
]


def write_outputs(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """All files of a run; the plots first, so the report can name the ones drawn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = draw_all(results, out_dir)
    paths = [*plots, write_json(results, out_dir), write_csv(results, out_dir)]
    report = out_dir / "report.md"
    report.write_text(render_markdown(results, [p.name for p in plots]))
    return [*paths, report]


def rerender(out_dir: Path) -> list[Path]:
    """Redraw the plots and rewrite report.md and results.csv from an existing results.json."""
    results = json.loads((out_dir / "results.json").read_text())
    plots = draw_all(results, out_dir)
    report = out_dir / "report.md"
    report.write_text(render_markdown(results, [p.name for p in plots]))
    return [*plots, write_csv(results, out_dir), report]


def write_json(results: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "results.json"
    path.write_text(json.dumps(json_ready(results), indent=1, sort_keys=False) + "\n")
    return path


def csv_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per configuration: the measured ones first, then every simulated sweep point."""
    rows = []
    for name, m in results["measured"].items():
        ttft = m["ttft_s"]
        rows.append(
            {
                "config": name,
                "source": "measured",
                "order": m.get("order", ""),
                "capacity_share": m.get("capacity_share", ""),
                "capacity_mib": _mib(m.get("capacity_bytes")),
                "eviction": m.get("eviction", ""),
                "skew": results["config"]["skew"],
                "requests": m["requests"],
                "token_hit_rate": m["token_hit_rate"],
                "oracle_hit_rate": m.get("oracle_hit_rate", ""),
                "of_oracle": m.get("of_oracle", ""),
                "request_hit_rate": "",
                "context_hit_rate": "",
                "ttft_mean_s": ttft["mean"],
                "ttft_p50_s": ttft["p50"],
                "ttft_p95_s": ttft["p95"],
                "tpot_ms": _ms(m["tpot_s"]),
                "throughput_tok_s": m["throughput_tok_s"] if m["throughput_tok_s"] is not None else "",
                "speedup_vs_off": m["speedup_vs_off_mean"],
            }
        )
    for r in results["sweep"]:
        row = {k: r.get(k, "") for k in CSV_COLUMNS}
        row.update(source="simulated hits, modelled TTFT", capacity_mib=_mib(r["capacity_bytes"]))
        row["tpot_ms"] = 1000 * r["tpot_s"]
        rows.append(row)
    return rows


def write_csv(results: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "results.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in csv_rows(results):
            writer.writerow({k: _cell(v) for k, v in row.items()})
    return path


# ---- markdown -----------------------------------------------------------------------------------------


def render_markdown(results: dict[str, Any], plots: Sequence[str]) -> str:
    parts = [
        _header(results),
        _headline(results),
        _targets(results),
        _workload(results),
        _measured(results),
        _sweep(results),
        _skews(results),
        _plots(plots),
        _engine_section(results),
        weights_markdown(results),
        chunks_markdown(results),
        quality_markdown(results),
        _radix_section(results),
        _kv_section(results),
        retrieval_section(results),
        exactness_markdown(results),
        _method(results),
    ]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


def _header(res: dict[str, Any]) -> str:
    meta = res["meta"]
    m = meta["machine"]
    mode = " (`--quick`)" if res["config"]["quick"] else ""
    return (
        f"# prefixrag benchmark: prefix-cache hit rate vs time to first token{mode}\n\n"
        f"Run on {meta['date']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']:.0f} GiB, no GPU), "
        f"{m['platform']}; Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}; "
        f"commit `{meta['commit']}`. `{meta['command']}` took {meta['wall_s'] / 60:.1f} min{_cpu(meta)}.\n\n"
        f"The machine is shared with other jobs{_load(meta)}, so absolute timings are noisy and slower "
        f"than on an idle machine: the real configurations ran interleaved request by request "
        f"({_order(res)}), and the comparisons below are ratios of figures measured side by side in this "
        "one run, on the same requests."
    )


def _order(res: dict[str, Any]) -> str:
    """How the configurations took turns within a round (runs that did not record it rotated the engines only)."""
    if all("places" in m for m in res["measured"].values()):
        return "the order of all of them rotating from request to request"
    return "the engine configurations' order rotating; caching off and transformers after them"


def _cpu(meta: dict[str, Any]) -> str:
    cpu = meta.get("cpu_s")
    return f" ({cpu / 60:.1f} CPU-minutes over all threads)" if cpu else ""


def _load(meta: dict[str, Any]) -> str:
    load = meta.get("load_average")
    if not load:
        return ""
    return (
        f" (1-minute load average during the run: {load['mean']:.1f} on average, {load['max']:.1f} at "
        f"most, on {meta['machine']['cores']} cores)"
    )


def _headline(res: dict[str, Any]) -> str:
    h = res["headline"]
    ref, off, hf = h["reference"], h["off"], h["transformers"]
    fit = res["fit"]
    vs_off, vs_hf = ref["vs_off"], h["vs_transformers"]
    lines = [
        "## Headline",
        "",
        f"- **{h['reference_name']}** (the cache sized to hold the whole working set, "
        f"{res['workload']['working_set_mib'][str(res['config']['skew'])]:,.0f} MiB): mean TTFT "
        f"**{ref['ttft_s']['mean']:.2f} s** over the {ref['requests']}-request stream (p50 "
        f"{ref['ttft_s']['p50']:.2f} s, p95 {ref['ttft_s']['p95']:.2f} s).",
        f"- On the {vs_off['requests']} requests caching off also ran (spread evenly over the stream): "
        f"**{vs_off['ttft_s']['mean']:.2f} s** vs **{off['ttft_s']['mean']:.2f} s** with caching off (p50 "
        f"{vs_off['ttft_s']['p50']:.2f} s vs {off['ttft_s']['p50']:.2f} s): "
        f"**{vs_off['speedup_mean']:.2f}x lower mean**, {vs_off['speedup_p50']:.2f}x lower p50.",
        f"- Against plain transformers `generate` on the {vs_hf['requests']} requests it ran, same prompts: "
        f"{vs_hf['ttft_s']['mean']:.2f} s vs {hf['ttft_s']['mean']:.2f} s mean, "
        f"**{vs_hf['speedup_mean']:.2f}x** lower mean TTFT.",
        f"- Token hit rate {100 * ref['token_hit_rate']:.1f}% = {100 * ref['of_oracle']:.1f}% of the oracle's "
        f"({100 * ref['oracle_hit_rate']:.1f}%, an unbounded cache on the same prompts); the real engine's "
        f"cached tokens equal the simulation's on every measured request: "
        f"**{'yes' if h['all_match'] else 'NO'}**.",
        f"- Requests whose topic was already asked about: mean TTFT {_s(h['repeat_mean'])} vs "
        f"{_s(h['first_mean'])} for the first request of a topic (compulsory misses, "
        f"{100 * h['first_share']:.0f}% of the stream).",
        *_steady_lines(res.get("steady_state")),
        f"- Fit over {fit['n']} measured engine requests: TTFT = {fit['a'] * 1000:.0f} ms + "
        f"{fit['b'] * 1000:.2f} ms x uncached tokens (R² = {fit['r2']:.3f}); it puts caching off at "
        f"{h['off_modelled_mean']:.2f} s against {off['ttft_s']['mean']:.2f} s measured, the size of error the "
        f"modelled figures carry.",
    ]
    return "\n".join(lines)


def _targets(res: dict[str, Any]) -> str:
    rows = ["## Targets", "", "| target | value | met | note |", "|---|---|---|---|"]
    for t in res["targets"]:
        value = t["value"]
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        rows.append(f"| {t['target']} | {shown} | {'yes' if t['met'] else '**no**'} | {t['note']} |")
    return "\n".join(rows)


def _workload(res: dict[str, Any]) -> str:
    w, c = res["workload"], res["config"]
    ws = ", ".join(
        f"skew {s}: {mib:,.0f} MiB ({w['working_set_tokens'][s]:,} tokens)"
        for s, mib in w["working_set_mib"].items()
    )
    return "\n".join(
        [
            "## Workload",
            "",
            f"{c['requests']} requests, seed {c['seed']}, over the {w['topics']} topics of the bundled Python "
            f"reference ({w['chunks']} chunks) with Zipf popularity (skew {c['skew']:g} measured; "
            f"{', '.join(f'{s:g}' for s in w['skews'])} simulated), {c['tenants']} tenant(s), {c['turns']} turn(s) "
            f"per conversation. Each prompt: a {w['system_prompt_tokens']}-token system prompt, "
            f"{w['tools_tokens']} tokens of tool schemas (stable prefix {w['stable_tokens']} tokens with the chat "
            f"scaffolding), top-{c['top_k']} retrieved chunks (hybrid retrieval, chunks of at most 256 tokens, "
            f"median retrieval {w['retrieve_ms_median']:.0f} ms, done once and shared by every configuration) and "
            f"a unique ~{w['question_tokens_mean']:.0f}-token question: {w['prompt_tokens_mean']:.0f} tokens on "
            f"average. KV costs {w['bytes_per_token']:,} bytes per token; working set (what an unbounded cache "
            f"holds after the stream, largest over the chunk orders): {ws}.",
        ]
    )


def _measured(res: dict[str, Any]) -> str:
    rows = [
        "## Measured on the real engine (same request stream)",
        "",
        "| configuration | requests | token hit rate | = simulated | TTFT mean | p50 | p95 | modelled mean "
        "| vs off, same requests (mean / p50) | TPOT | tokens/s* |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in res["measured"].items():
        t = m["ttft_s"]
        modelled = f"{m['modelled_ttft_mean_s']:.2f} s" if "modelled_ttft_mean_s" in m else ""
        same = (
            ("yes" if m["simulation_matches"] and m["prompts_match"] else "**no**")
            if "simulation_matches" in m
            else "n/a"
        )
        rows.append(
            f"| {name} | {m['requests']} | {100 * m['token_hit_rate']:.1f}% | {same} | {t['mean']:.2f} s | "
            f"{t['p50']:.2f} s | {t['p95']:.2f} s | {modelled} | "
            f"{_ratio(m['speedup_vs_off_mean'])} / {_ratio(m['speedup_vs_off_p50'])} ({m['vs_off']['requests']}) | "
            f"{_ms_cell(m['tpot_s'])} | {_num_cell(m['throughput_tok_s'])} |"
        )
    tp = res["tpot"]
    off, hf = res["measured"][OFF], res["measured"][TRANSFORMERS]
    shared = len(set(off["indices"]) & set(hf["indices"]))
    hf_runs = (
        f"{hf['requests']} of those"
        if shared == hf["requests"]
        else f"{hf['requests']} ({shared} of them among caching off's)"
    )
    rows += [
        "",
        f"\\* tokens/s: one request at a time with {res['config']['answer_tokens']}-token answers, "
        f"= answer / (TTFT mean + (answer - 1) x TPOT). TPOT measured apart ({tp['source']}): "
        f"engine {1000 * tp['engine']['p50']:.0f} ms/token, "
        f"transformers generate {1000 * tp['transformers']['p50']:.0f} ms/token"
        + (
            f", llama.cpp {1000 * tp['llama.cpp']['p50']:.0f} ms/token (its own decode, from the weights section)"
            if "llama.cpp" in tp
            else ""
        )
        + f". Caching off ran on {off['requests']} requests spread evenly over the stream and transformers "
        f"generate on {hf_runs} (their TTFT does not depend on earlier requests); each configuration's mean "
        "and percentiles are over the requests it ran, and every ratio against caching off is taken on the "
        "requests both ran (their number in brackets). Each row's hit rate, TPOT and tokens/s are that "
        "system's own; an empty cell was not measured.",
        "",
        f"llama.cpp baseline: {res['baselines']['llama_cpp']['note']}.",
    ]
    return "\n".join(rows)


def _sweep(res: dict[str, Any]) -> str:
    skew = res["config"]["skew"]
    rows = [
        f"## Sweep at skew {skew:g} (hit rates simulated exactly; TTFT modelled from the fit)",
        "",
        "| order | eviction | capacity | token hit | oracle | of oracle | context reuse | TTFT mean | p50 | p95 "
        "| vs off |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in res["sweep"] if r["skew"] == skew):
        rows.append(
            f"| {r['order']} | {r['eviction']} | {r['capacity_share']:.0%} ({_mib(r['capacity_bytes']):,.0f} MiB) | "
            f"{100 * r['token_hit_rate']:.1f}% | {100 * r['oracle_hit_rate']:.1f}% | {100 * r['of_oracle']:.1f}% | "
            f"{100 * r['context_hit_rate']:.0f}% | {r['ttft_mean_s']:.2f} s | {r['ttft_p50_s']:.2f} s | "
            f"{r['ttft_p95_s']:.2f} s | {r['speedup_vs_off']:.1f}x |"
        )
    rows += [
        "",
        "Context reuse: share of requests that reused at least their first retrieved chunk whole (or, for a "
        "follow-up, the whole earlier conversation). 0% capacity is caching off.",
    ]
    problems = res["checks"]["capacity_monotone_violations"]
    rows.append(
        "More capacity never lowered the oracle-normalised hit rate by more than 1 point."
        if not problems
        else "Capacity monotonicity violations: " + "; ".join(problems)
    )
    return "\n".join(rows)


def _skews(res: dict[str, Any]) -> str:
    skews = sorted({r["skew"] for r in res["sweep"]})
    if len(skews) < 2:
        return ""
    rows = [
        "## Popularity skew (simulated, LRU)",
        "",
        "| skew | capacity | relevance | canonical | cache | oracle (cache order) | modelled speedup (cache) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in skews:
        for share in sorted({r["capacity_share"] for r in res["sweep"] if r["capacity_share"] > 0}):
            by = {
                r["order"]: r
                for r in res["sweep"]
                if r["skew"] == s and r["capacity_share"] == share and r["eviction"] == "lru"
            }
            if "cache" not in by:
                continue
            cells = " | ".join(
                f"{100 * by[o]['token_hit_rate']:.1f}%" if o in by else ""
                for o in ("relevance", "canonical", "cache")
            )
            rows.append(
                f"| {s:g} | {share:.0%} | {cells} | {100 * by['cache']['oracle_hit_rate']:.1f}% | "
                f"{by['cache']['speedup_vs_off']:.1f}x |"
            )
    return "\n".join(rows)


def _plots(plots: Sequence[str]) -> str:
    lines = ["## Plots", ""]
    for name in plots:
        lines += [f"### {PLOTS.get(name, name)}", "", f"![{PLOTS.get(name, name)}]({name})", ""]
    return "\n".join(lines)


def _engine_section(res: dict[str, Any]) -> str:
    eng = res.get("engine_section")
    if not eng:
        return f"## {ENGINE_TITLE}\n\nNot run (`--no-engine-section`)."
    t, d = eng["ttft"], eng["decode"]
    batched = ", ".join(
        f"{b}: {v['tokens_per_s']:.1f} tok/s" for b, v in eng.get("batched_decode", {}).items()
    )
    return "\n".join(
        [
            f"## {ENGINE_TITLE}",
            "",
            f"A {eng['prompt_tokens']}-token RAG prompt, {eng['warm_cached_tokens']} tokens cached when warm "
            f"(TTFT: medians of {eng['repeats']} rounds, interleaved; decode: median of {d['runs']} runs each, "
            "interleaved):",
            "",
            "| figure | value | target |",
            "|---|---|---|",
            f"| cold TTFT (caching off) | {t['cold_s']:.2f} s | |",
            f"| warm TTFT (prefix cached, new question) | {t['warm_s']:.3f} s ({t['speedup']:.1f}x faster) "
            f"| <= 1/15 of cold: {'met' if t['warm_over_cold'] <= 1 / 15 else '**missed**'} |",
            _overhead_row(t),
            f"| cache assembly (match + KV load + insert) | {1000 * t['assembly_s']:.1f} ms = "
            f"{100 * t['assembly_share_of_warm']:.1f}% of warm TTFT "
            f"| <= 10%: {'met' if t['assembly_share_of_warm'] <= 0.10 else '**missed**'} |",
            f"| decode, engine vs transformers generate (median of {d['runs']} runs) | {d['ours_ms_per_token']:.0f} vs "
            f"{d['transformers_generate_ms_per_token']:.0f} ms/token ({d['speedup']:.2f}x) "
            f"| no slower: {'met' if d['speedup'] >= 1.0 else '**missed**'} |",
            "",
            f"Batched decode throughput by concurrent requests: {batched}.",
            *_limits_lines(eng),
            *_dtype_lines(eng.get("dtypes")),
            "",
            _vllm_line(res),
        ]
    )


def _vllm_line(res: dict[str, Any]) -> str:
    """Where the side-by-side with vLLM is, or why there is none."""
    vllm = res.get("baselines", {}).get("vllm") or {}
    if not vllm.get("available"):
        return f"vLLM: {vllm.get('note', 'not checked')}."
    return (
        f"vLLM ({vllm['note']}): the side-by-side comparison (the same client against both servers, "
        "`vllm bench serve`, the RAG stream) is its own run, `make bench-vllm`, written to "
        "[vllm/vllm.md](vllm/vllm.md)."
    )


def _peak(name: str, gflops: float, limits: dict[str, Any]) -> str:
    size = limits.get("matmul_sizes", {}).get(name, limits["matmul_size"])
    figure = f"{gflops:.0f}" if gflops >= 10 else f"{gflops:.1f}"
    if limits.get("matmul_kernels", {}).get(name) == "native":
        return f"{name} {figure} (engine.native's Linear, faster here than torch's matmul)"
    return f"{name} {figure}" + (
        f" ({size}-square: emulated on this CPU)" if size < limits["matmul_size"] else ""
    )


def _limits_lines(eng: dict[str, Any]) -> list[str]:
    """The machine's limits measured in this run, and decode and prefill as shares of them."""
    limits, share = eng.get("limits"), eng.get("shares")
    if not limits or not share:
        return []
    peaks = ", ".join(_peak(name, gflops, limits) for name, gflops in limits["matmul_gflops"].items())
    return [
        "",
        f"Physical limits, measured in this run at {limits['threads']} threads: memory read "
        f"{limits['read_gb_s']:.1f} GB/s and copy {limits['copy_gb_s']:.1f} GB/s (read + written) over "
        f"{limits['buffer_bytes'] / 2**30:.0f} GiB; a {limits['matmul_size']}-square matmul peaks at {peaks} "
        f"GFLOP/s (int8: GOP/s). Against them, in {eng['dtype']} ({eng.get('dtype_reason', '')}): decode "
        f"streams {share['decode_bytes'] / 1e6:.0f} MB a token (weights and the {eng['prompt_tokens']}-token "
        f"context's KV) at {share['decode_gb_s']:.1f} GB/s = {100 * share['decode_share_of_read']:.0f}% of the "
        f"read bandwidth; cold prefill computes {share['prefill_flops'] / 1e9:.0f} GFLOP at "
        f"{share['prefill_gflops']:.0f} GFLOP/s = {100 * share['prefill_share_of_peak']:.0f}% of the "
        f"{eng['dtype']} matmul peak. (The weights can sit partly in a large last-level cache, so decode "
        "may exceed the DRAM figure.)",
    ]


def _dtype_lines(dtypes: dict[str, Any] | None) -> list[str]:
    """float32 against bfloat16, measured side by side on the same prompts."""
    if not dtypes:
        return []
    if "not_run" in dtypes:
        return ["", f"float32 against bfloat16: {dtypes['not_run']}."]
    fp32, bf16, up = dtypes["float32"], dtypes["bfloat16"], dtypes["speedup"]
    cpu = ", ".join(f"{flag} {'yes' if has else 'no'}" for flag, has in dtypes["cpu"].items())
    return [
        "",
        f"float32 against bfloat16 (same prompts, interleaved, medians of {dtypes['repeats']} rounds; "
        f"this CPU: {cpu}):",
        "",
        "| figure | float32 | bfloat16 | bfloat16 speedup |",
        "|---|---|---|---|",
        f"| cold TTFT (caching off) | {fp32['cold_s']:.2f} s | {bf16['cold_s']:.2f} s | {up['cold']:.2f}x |",
        f"| warm TTFT | {fp32['warm_s']:.3f} s | {bf16['warm_s']:.3f} s | {up['warm']:.2f}x |",
        f"| decode | {fp32['decode_ms_per_token']:.0f} ms/token | {bf16['decode_ms_per_token']:.0f} ms/token "
        f"| {up['decode']:.2f}x |",
    ]


def _radix_section(res: dict[str, Any]) -> str:
    rad = res.get("radix_section")
    if not rad:
        return f"## {RADIX_TITLE}\n\nNot run (`--no-radix-section`)."
    rows = [
        f"## {RADIX_TITLE}",
        "",
        f"RadixCache alone, {rad['config']['requests']} requests of Zipf-popular 500-2,000-token prefixes "
        f"plus unique suffixes (µs per call, median / p95):",
        "",
        "| policy | cached tokens | match | insert | match + insert | 2,000-token match + insert | hit rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for policy, levels in rad["results"].items():
        for level, r in levels.items():
            rows.append(
                f"| {policy} | {int(level):,} | {_us(r['match_us'])} | {_us(r['insert_us'])} | "
                f"{_us(r['match_insert_us'])} | {_us(r['match_insert_2000_us'])} | {100 * r['hit_rate']:.1f}% |"
            )
    worst = max(
        (r["match_insert_2000_us"]["median"] for levels in rad["results"].values() for r in levels.values()),
        default=math.nan,
    )
    rows += [
        "",
        f"Target: a 2,000-token match + insert under 1 ms at 100k cached tokens: worst median "
        f"{worst:.0f} µs, {'met' if worst < 1000 else '**missed**'}.",
    ]
    return "\n".join(rows)


def _kv_section(res: dict[str, Any]) -> str:
    kv = res.get("kv_section")
    if not kv:
        return "## KV tiers: storage formats, the disk and the remote tier\n\nNot run (`--no-kv-section`)."
    fid, bpt = kv["fidelity"], kv["bytes_per_token"]
    rows = [
        "## KV tiers: storage formats, the disk and the remote tier",
        "",
        f"KV storage formats for {kv['model']}: bytes per token, and fidelity "
        f"against float32 KV over {fid['prompts']} RAG prompts of {kv['prompt_tokens']:,} tokens, "
        f"teacher-forced on float32 KV's greedy answer for {fid['tokens']} tokens (the greedy answer of a "
        "format equals float32's exactly when every position's top token agrees). Cached output equals "
        "uncached output within each format (the exactness tests); this is the cost of choosing the format.",
        "",
        "| kv_dtype | bytes/token | mean KL (nats) | max KL | top-1 agreement | first token | greedy exact match "
        "| greedy agreement |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, b in bpt.items():
        f = fid[name]
        rows.append(
            f"| {name} | {b:,} | {_n(f['mean_kl'], '.2e')} | {_n(f['max_kl'], '.2e')} | "
            f"{_pct(f['top1_agreement'], '.1f')} | {_pct(f['first_token_agreement'])} | "
            f"{_pct(f['greedy_exact_match'])} | {_pct(f['greedy_agreement'])} |"
        )
    ws = kv.get("working_set")
    if ws:
        rows += [
            "",
            f"The stream's working set, {ws['tokens']:,} tokens, takes "
            + ", ".join(f"{_n(g, '.2f')} GiB in {n}" for n, g in ws["gib"].items())
            + ".",
        ]
    rows += [
        "",
        "Disk tier: TTFT of a repeated prompt, medians of the rounds (interleaved). Cold: caching off. "
        "RAM-warm: repeated in the engine that computed it (all but the last token cached). Disk: repeated in "
        "a restarted engine (a fresh Engine: empty RAM cache, a new disk tier scanning the folder) whose block "
        "files were dropped from the page cache first (`posix_fadvise(DONTNEED)` on each file); "
        '"first request" is the restarted engine\'s very first request (its KV buffer is new memory), '
        '"warm process" the same after one other request.',
        "",
        "| kv_dtype | prompt | cold | RAM-warm | disk, first request | disk, warm process | disk / RAM-warm "
        "| cold / disk | disk read | per block |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d in kv["disk_ttft"].items():
        rows.append(
            f"| {name} | {d['prompt_tokens']:,} ({d['cached_disk']:,} from disk) | {_n(d['cold_s'], '.2f')} s | "
            f"{_n(d['ram_s'], '.3f')} s | {_n(d['disk_first_s'], '.3f')} s | {_n(d['disk_s'], '.3f')} s | "
            f"{_n(d['disk_first_over_ram'], '.2f')}x / {_n(d['disk_over_ram'], '.2f')}x | "
            f"{_n(d['cold_over_disk_first'], '.1f')}x / {_n(d['cold_over_disk'], '.1f')}x | "
            f"{_n(d['read_mb_s'], ',.0f')} MB/s | {_n(d['read_ms_per_block'], '.1f')} ms |"
        )
    be, zero = kv["break_even"], kv["zero_hit"]
    points = ", ".join(
        f"{r['tokens']} tokens: disk {_n(r['load_s'], '.4f')} s vs compute {_n(r['compute_s'], '.3f')} s"
        for r in be["rows"]
    )
    crossing = be["break_even_tokens"]
    rows += [
        "",
        f"Break-even prefix length (float32 KV, cold files, recycled buffers): {points}; the fitted lines cross "
        + (
            "nowhere in range: the disk is faster at every length"
            if crossing == 0
            else f"at {crossing:.0f} tokens"
            if isinstance(crossing, (int, float)) and math.isfinite(crossing)
            else "nowhere: computing is cheaper per token than reading (check the disk)"
        )
        + "; the disk tier stores 64-token blocks and reads the last one in part where a prompt diverges.",
        "",
        f"0% hits, {zero['requests']} prompts back to back (the disk writer overlaps the next prefill): TTFT "
        f"{_n(zero['tier_on_s'], '.2f')} s with the disk tier on vs {_n(zero['caching_off_s'], '.2f')} s caching "
        f"off ({_n(zero['overhead'], '+.1%')}); the writer spent {_n(zero['write_ms_per_block'], '.1f')} ms per "
        f"block, {_n(zero.get('write_cpu_ms_per_block'), '.1f')} ms of it on the CPU (the rest waits on fsync), "
        f"{_n(zero['written_mb'], '.0f')} MB written. Blocks are written when they are inserted, not when RAM evicts "
        "them: then a SIGKILL or a restart loses nothing the RAM tier held, and replicas see each other's "
        "blocks at once.",
        *remote_rows(kv.get("remote")),
        "",
        "| target | value | met | note |",
        "|---|---|---|---|",
    ]
    for t in kv["targets"]:
        rows.append(
            f"| {t['target']} | {_n(t['value'], ',.2f')} | {'yes' if t['met'] else '**no**'} | {t['note']} |"
        )
    return "\n".join(rows)


def _n(value: Any, spec: str) -> str:
    """A number formatted, or "n/a" for one that was not measured (NaN, stored as null in the JSON)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)


def _pct(value: Any, spec: str = ".0f") -> str:
    return "n/a" if value is None else f"{format(100 * value, spec)}%"


def _method(res: dict[str, Any]) -> str:
    measured = ", ".join(f"`{n}`" for n in res["measured"])
    return "\n".join(
        [
            "## Method: what is measured, what is simulated, what is modelled",
            "",
            f"- **Measured** on this machine: {measured}. The engine configurations served every request of "
            "the stream with `max_tokens=1` (TTFT is the engine's own submission-to-first-token time); "
            "time per output token was measured apart.",
            "- **Simulated exactly**: the hit rates of every sweep configuration. The request stream is replayed "
            "through a real `RadixCache` whose values are fake KV segments of the engine's real bytes per token, "
            "making the engine's exact cache calls (match capped at len-1 and locked, one insert of the prompt once "
            "its token is out, unlock); the `cache` chunk order probes that simulated cache, as the pipeline "
            "probes the engine's. Check: on every measured configuration the real engine's prompts and cached "
            "tokens equal the simulation's, request by request, and its bytes per token equal the simulation's.",
            "- **Modelled**: TTFT of the simulated-only configurations, predicted per request as a + b x uncached "
            "tokens with the least-squares fit over all measured engine requests (cached and caching off). The "
            "fit ignores that attention over a long cached prefix costs a little more per uncached token.",
            "- **Oracle**: the hit rate of an unbounded cache on the very same prompts (an independent "
            "implementation: a set of prefix fingerprints), so a configuration can never exceed it.",
        ]
    )


def _overhead_row(t: dict[str, Any]) -> str:
    """0%-hit overhead, judged on the TTFT ratio; the cache's own timed work shown beside it."""
    ratio = t["zero_hit_overhead"]
    return (
        f"| overhead at 0% hits vs caching off | TTFT {100 * ratio:+.1f}% (cold TTFT itself spread "
        f"{100 * t['cold_spread']:.0f}% over the rounds); the cache's own work: "
        f"{1000 * t['zero_hit_before_token_s']:.1f} ms before the first token (match), and the copy of "
        f"the prompt's KV into the cache ({1000 * t['zero_hit_insert_s']:.1f} ms) after it "
        f"| <= 3%: {_met(ratio <= 0.03)} |"
    )


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _steady_lines(steady: dict[str, Any] | None) -> list[str]:
    if not steady:
        return []
    cold, warm = steady["cold"], steady["warm"]
    return [
        f"- Once the cache is warm (simulated: the same seeded stream continued to {steady['requests']} "
        f"requests, unbounded cache, `cache` order): the last {steady['window']} requests reach a "
        f"{100 * warm['token_hit_rate']:.1f}% token hit rate and a modelled {warm['modelled_speedup']:.1f}x "
        f"mean speedup, against {100 * cold['token_hit_rate']:.1f}% and {cold['modelled_speedup']:.1f}x for "
        f"the first {steady['window']} (the measured stream, from a cold start)."
    ]


# ---- helpers ------------------------------------------------------------------------------------------


def _ratio(value: float | None) -> str:
    """A speedup with two decimals; 'n/a' when no request was shared (NaN, null in JSON)."""
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:.2f}x"


def _s(seconds: float | None) -> str:
    """Seconds with two decimals; 'n/a' for a missing figure (NaN, written to JSON as null)."""
    if seconds is None or math.isnan(seconds):
        return "n/a"
    return f"{seconds:.2f} s"


def _ms(seconds: float | None) -> Any:
    return 1000 * seconds if seconds is not None else ""


def _ms_cell(seconds: float | None) -> str:
    return f"{1000 * seconds:.0f} ms" if seconds is not None else ""


def _num_cell(v: float | None) -> str:
    return f"{v:.1f}" if v is not None else ""


def _us(s: dict[str, float]) -> str:
    return f"{s['median']:.0f} / {s['p95']:.0f}"


def _mib(nbytes: Any) -> Any:
    return nbytes / 2**20 if isinstance(nbytes, (int, float)) else ""


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return v


def json_ready(obj: Any) -> Any:
    """JSON has no NaN or infinity: null instead (a figure with no sample, e.g. the mean of nothing).

    >>> json_ready({"mean": float("nan"), "n": [0, 1.5]})
    {'mean': None, 'n': [0, 1.5]}
    """
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    return obj
