"""Markdown for the vLLM comparison (``prefixrag bench-vllm``): client rows, vllm bench serve, RAG stream,
each with the target it is held to.

Example:
    >>> vllm_markdown({"available": False, "note": "vLLM is not built"})
    '## prefixrag against vLLM on the same machine\\n\\nNot compared: vLLM is not built.\\n'
"""

from __future__ import annotations

import math
from typing import Any

TITLE = "## prefixrag against vLLM on the same machine"
PREFIXRAG_DEFAULT = "prefixrag (defaults)"
CLIENT_FIGURES = (
    ("cold TTFT (new ~1,500-token prompt)", "cold_ttft_s", "s"),
    ("warm TTFT (same prompt again)", "warm_ttft_s", "s"),
    ("TTFT, last ~20 tokens differ", "differ_ttft_s", "s"),
    ("decode at the long context", "decode_long_ms", "ms"),
    ("decode, short context", "decode_short_ms", "ms"),
)
# (figure, ours over vLLM's at most): cold <= 0.75x, warm and last-20 <= 0.6x, decode <= 0.6x
CLIENT_TARGETS = {"cold_ttft_s": 0.75, "warm_ttft_s": 0.6, "differ_ttft_s": 0.6, "decode_long_ms": 0.6}
# one stream's decode at the long context, at most (ms/token), by what the row computes in
DECODE_BOUNDS_MS = {"bfloat16": 20, "int8 weights": 12}


def vllm_markdown(res: dict[str, Any], command: str = "prefixrag bench-vllm") -> str:
    if not res.get("available"):
        return f"{TITLE}\n\nNot compared: {res.get('note', 'vLLM did not run')}.\n"
    seconds = ", ".join(f"{k} {v / 60:.1f} min" for k, v in res.get("seconds", {}).items())
    parts = [
        TITLE,
        "",
        f"`{command}`; {res['note']}; each system a server in its own subprocess, measured one after "
        f"another ({seconds}). vLLM's best thread binding here: **{res.get('best_binding')}** (the one "
        "whose cold prompt plus whole answer took least; `auto` is vLLM's default: on 2 cores one "
        "compute thread and the other core for its API server, `0-1` computes on both).",
        *_client_rows(res),
        *_serve(res),
        *_stream(res),
    ]
    return "\n".join(parts).rstrip() + "\n"


def _best_vllm(res: dict[str, Any]) -> dict[str, Any] | None:
    best = res.get("best_binding")
    return next((r for name, r in res["rows"].items() if name.endswith(f"threads {best}")), None)


def _client_rows(res: dict[str, Any]) -> list[str]:
    rows = res.get("rows") or {}
    names = list(rows)
    lines = [
        "",
        "### The same client against every server",
        "",
        f"Streamed chat completions, greedy, `ignore_eos`; medians of {res['config']['repeats']} rounds "
        "(TTFT: to the first chunk that carries text; decode: (last token - first) / (tokens - 1)).",
        "",
        "| figure | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label, key, unit in CLIENT_FIGURES:
        cells = [_value(rows[n], key, unit) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [f"- {n} failed: {rows[n]['error']}" for n in names if "error" in rows[n]]
    ours, peer = rows.get(PREFIXRAG_DEFAULT), _best_vllm(res)
    if ours and peer and "error" not in ours and "error" not in peer:
        lines += ["", "Targets (prefixrag at its default dtype over vLLM at its best binding):", ""]
        for label, key, _ in CLIENT_FIGURES:
            if key in CLIENT_TARGETS:
                ratio = ours[key] / peer[key]
                met = ratio <= CLIENT_TARGETS[key]
                lines.append(f"- {label}: {ratio:.2f}x (<= {CLIENT_TARGETS[key]}x: {_met(met)})")
        lines += _decode_bounds(rows)
    return lines


def _decode_bounds(rows: dict[str, Any]) -> list[str]:
    """One stream's decode at the long context against its absolute bound, on the row each bound
    names: bfloat16 (the defaults where auto picks it, else the bfloat16 variant), and int8 weights."""
    lines = []
    for what, bound in DECODE_BOUNDS_MS.items():
        name = next((n for n in rows if _decodes_as(n, rows[n], what)), None)
        if name is None or "error" in rows[name]:
            lines.append(f"- one stream's decode at the long context in {what}: not measured (no such row)")
            continue
        decode = rows[name]["decode_long_ms"]
        lines.append(
            f"- one stream's decode at the long context in {what} ({name}): {decode:.1f} ms/token "
            f"(<= {bound}: {_met(decode <= bound)})"
        )
    return lines


def _decodes_as(name: str, row: dict[str, Any], what: str) -> bool:
    if not name.startswith("prefixrag"):
        return False
    if what == "int8 weights":
        return "weights int8" in name
    dtype = (row.get("server_info") or {}).get("dtype") or {}
    return "weights int8" not in name and dtype.get("dtype") == "bfloat16"


def _serve(res: dict[str, Any]) -> list[str]:
    serve = res.get("serve")
    if not serve:
        return []
    lines = [
        "",
        "### vLLM's own client: `vllm bench serve`",
        "",
        f"`--backend openai-chat --ignore-eos`, {res['config']['output_len']} output tokens; "
        f"`prefix_repetition`: {res['config']['prefixes']} prefixes of {res['config']['prefix_len']} "
        f"tokens, {res['config']['suffix_len']}-token suffixes; `random`: {res['config']['prefix_len']}-token "
        "prompts. Output tokens: what the client received of what it asked for.",
        "",
        "| server | dataset @ concurrency | output tok/s | mean TPOT | p95 ITL | mean TTFT | p95 TTFT | output tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for server, runs in serve.items():
        if "error" in runs:
            lines.append(f"| {server} | failed: {runs['error']} | | | | | | |")
            continue
        for key, run in runs.items():
            lines.append(
                f"| {server} | {key} | {run.get('output_throughput', math.nan):.1f} | "
                f"{run.get('mean_tpot_ms', math.nan):.0f} ms | {run.get('p95_itl_ms', math.nan):.0f} ms | "
                f"{run.get('mean_ttft_ms', math.nan):.0f} ms | {run.get('p95_ttft_ms', math.nan):.0f} ms | "
                f"{run.get('total_output_tokens', 0)} / {run.get('expected_output_tokens', 0)} |"
            )
    lines += _serve_targets(serve)
    return lines


def _serve_targets(serve: dict[str, Any]) -> list[str]:
    ours = serve.get("prefixrag", {}).get("prefix_repetition@4")
    peer = next(
        (runs.get("prefix_repetition@4") for name, runs in serve.items() if name != "prefixrag"), None
    )
    if not ours or not peer:
        return []
    up = ours["output_throughput"] / peer["output_throughput"]
    tpot = ours["mean_tpot_ms"] / peer["mean_tpot_ms"]
    return [
        "",
        "Targets at prefix_repetition, concurrency 4 (prefixrag over vLLM): output throughput "
        f"{up:.2f}x (>= 1.3x: {_met(up >= 1.3)}), mean TPOT {tpot:.2f}x (<= 0.75x: {_met(tpot <= 0.75)}), "
        f"p95 ITL {ours['p95_itl_ms']:.0f} vs {peer['p95_itl_ms']:.0f} ms "
        f"({_met(ours['p95_itl_ms'] <= peer['p95_itl_ms'])}), p95 TTFT {ours['p95_ttft_ms']:.0f} vs "
        f"{peer['p95_ttft_ms']:.0f} ms ({_met(ours['p95_ttft_ms'] <= peer['p95_ttft_ms'])}).",
    ]


def _stream(res: dict[str, Any]) -> list[str]:
    stream = res.get("stream")
    if not stream:
        return []
    if "error" in stream:
        return ["", f"RAG stream: failed: {stream['error']}"]
    lines = [
        "",
        "### The RAG stream",
        "",
        f"The benchmark's first {stream['requests']} stream requests, each prompt assembled once and sent "
        "as token ids to each system, the order rotating (prefixrag in process, vLLM over HTTP)"
        + _stream_pacing(stream),
        "",
        "| system | mean TTFT | p50 TTFT | prompt tokens reused | vLLM's mean over this |",
        "|---|---|---|---|---|",
    ]
    for name, row in stream.items():
        if not isinstance(row, dict) or "ttft_s" not in row:
            continue
        ratio = row.get("vllm_over_this")
        lines.append(
            f"| {name} | {row['ttft_s']['mean']:.3f} s | {row['ttft_s']['p50']:.3f} s | "
            f"{100 * row['reuse_share']:.0f}% | {f'{ratio:.2f}x' if ratio else ''} |"
        )
    chunks = next((r for n, r in stream.items() if isinstance(r, dict) and "chunks" in n), None)
    if chunks:
        met = chunks["vllm_over_this"] >= 3
        lines += ["", f"Target: chunks mode's mean TTFT >= 3x lower than vLLM's: {_met(met)}."]
    return lines


def _value(row: dict[str, Any], key: str, unit: str) -> str:
    if "error" in row:
        return "failed"
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.3f} s" if unit == "s" else f"{v:.1f} ms/token"


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _stream_pacing(stream: dict[str, Any]) -> str:
    """How the stream paced its systems, as its results record it (older results record neither)."""
    parts = []
    if "pause_s" in stream:
        parts.append(
            f"after each vLLM request the next system waits {stream['pause_s']:g} s, because vLLM's engine "
            "keeps a core busy polling for about a second after a request"
        )
    if stream.get("ping_tokens"):
        parts.append(
            f"each measured request follows a {stream['ping_tokens']}-token one to the same system, so each "
            "is measured hot (vLLM starts a request slower once its poll has stopped)"
        )
    return "".join(f"; {p}" for p in parts) + "."
