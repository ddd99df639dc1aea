"""The chunks section of the report: TTFT and reuse per mode, fidelity per setting, its targets.

Example:
    >>> print(chunks_markdown(results))          # doctest: +SKIP
    ## Chunk reuse beyond the prefix
"""

from __future__ import annotations

import math
from typing import Any

NAIVE = "none"


def chunks_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 14's targets at the default operating point (``section["default"]``), with values."""
    label = section["default"]
    ttft = section["ttft"][f"chunks warm, {label}"]
    fid, naive_fid = section["fidelity"][label], section["fidelity"][NAIVE]
    speedup, reuse = ttft["speedup_vs_off_mean"], ttft["reuse_share"]
    kl, share, rouge = _num(fid["kl_mean"]), ttft["recomputed_of_stitched"], _num(fid["rouge_l"])
    better = {"KL": kl < _num(naive_fid["kl_mean"]), "ROUGE-L": rouge > _num(naive_fid["rouge_l"])}
    overhead = ttft["overhead_share_mean"]
    return [
        _target("chunks mode after warming: mean TTFT >= 5x lower than caching off", speedup, speedup >= 5),
        _target("token reuse (exact prefix + stitched chunks) >= 85% of prompt tokens", reuse, reuse >= 0.85),
        _target(
            f"mean KL <= 0.03 nats over the first {section['kl_positions']} answer positions, <= 20% of the "
            "reused chunks' tokens recomputed",
            kl,
            kl <= 0.03 and share <= 0.20,
            f"{100 * share:.1f}% recomputed",
        ),
        _target(f"ROUGE-L of the greedy {section['answer_tokens']}-token answer >= 0.8", rouge, rouge >= 0.8),
        _target(
            "better than the naive stitch on KL and ROUGE-L (answer accuracy: the answer-quality section)",
            ", ".join(k for k, ok in better.items() if ok) or "none",
            all(better.values()),
            f"naive: KL {_f(naive_fid['kl_mean'], 4)}, ROUGE-L {_f(naive_fid['rouge_l'], 2)}",
        ),
        _target(
            "stitching overhead (loading, rotating, selecting) <= 10% of chunks-mode TTFT",
            overhead,
            overhead <= 0.10,
        ),
    ]


def chunks_markdown(res: dict[str, Any]) -> str:
    section = res.get("chunks_section")
    if not section:
        return "## Chunk reuse beyond the prefix\n\nNot run (`--no-chunks-section`)."
    return "\n\n".join(
        [_intro(res, section), _ttft_table(section), _fidelity_table(section), _targets_table(section)]
    )


def _intro(res: dict[str, Any], s: dict[str, Any]) -> str:
    warm = s["warm"]
    return "\n".join(
        [
            "## Chunk reuse beyond the prefix",
            "",
            f'`reuse="chunks"` on the first {s["requests"]} requests of the same seeded stream (same chunks), '
            "interleaved request by request with the order rotating: caching off (a spread sample), exact prefix "
            f"mode, chunks mode from a cold cache (default recompute `{s['default']}`), and chunks mode after "
            f"warming the {warm['chunks']} chunks the stream retrieves ({warm['warmed']} placements prefilled, "
            f"{warm['tokens']:,} tokens in {warm['seconds']:.0f} s) once per recompute setting. A chunk's KV "
            "comes from its placement after the stable prefix, keys re-rotated to the new position; "
            "`first x%` recomputes the first x% of each reused chunk, `first_tail x%` half of x% as `first` and "
            "the rest as the reused tokens nearest the question, `deviation x% @1` the x% of reused tokens "
            "whose K/V deviate most at layer 1 (CacheBlend), `none` nothing (the naive stitch). Fidelity: "
            f"{s['fidelity_prompts']} prompts spread over those requests, each setting against full prefill on "
            "the same engine with caching off. What every strategy does to the answers: the answer-quality "
            "section below.",
        ]
    )


def _ttft_table(s: dict[str, Any]) -> str:
    rows = [
        "| configuration | requests | TTFT mean | p50 | p95 | vs off (mean) | token reuse (exact + stitched) "
        "| recomputed of stitched | stitching overhead |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in s["ttft"].items():
        t = m["ttft_s"]
        rows.append(
            f"| {name} | {m['requests']} | {_f(t['mean'])} s | {_f(t['p50'])} s | {_f(t['p95'])} s | "
            f"{_f(m['speedup_vs_off_mean'], 1)}x | {_pct(m['reuse_share'])} ({_pct(m['exact_share'])} exact) | "
            f"{_pct(m['recomputed_of_stitched'])} | {_pct(m['overhead_share_mean'])} "
            f"({_f(m['overhead_ms_mean'], 1)} ms) |"
        )
    return "\n".join(["### Time to first token and reuse (measured)", "", *rows])


def _fidelity_table(s: dict[str, Any]) -> str:
    rows = [
        "| setting | first-token agreement | greedy exact match | ROUGE-L | KL mean / median / max (nats) "
        "| TTFT vs off (warm) |",
        "|---|---|---|---|---|---|",
    ]
    for label, f in s["fidelity"].items():
        warm = s["ttft"].get(f"chunks warm, {label}", {})
        rows.append(
            f"| {label} | {_pct(f['first_token_agreement'])} | {_pct(f['greedy_exact_match'])} | "
            f"{_f(f['rouge_l'], 3)} | {_f(f['kl_mean'], 4)} / {_f(f['kl_median'], 4)} / {_f(f['kl_max'], 4)} | "
            f"{_f(warm.get('speedup_vs_off_mean'), 1)}x |"
        )
    return "\n".join(
        [
            f"### Fidelity to full prefill ({s['fidelity_prompts']} stream prompts, "
            f"{s['answer_tokens']}-token greedy answers, KL over the first {s['kl_positions']} answer positions "
            "teacher-forced on the full-prefill answer)",
            "",
            *rows,
        ]
    )


def _targets_table(s: dict[str, Any]) -> str:
    rows = [
        f"### Targets at the default operating point `{s['default']}`",
        "",
        "| target | value | met | note |",
        "|---|---|---|---|",
    ]
    for t in chunks_targets(s):
        value = t["value"]
        shown = _f(value, 3) if isinstance(value, float) else str(value)
        rows.append(f"| {t['target']} | {shown} | {'yes' if t['met'] else '**no**'} | {t['note']} |")
    return "\n".join(rows)


def _target(name: str, value: Any, met: bool, note: str = "") -> dict[str, Any]:
    return {"target": name, "value": value, "met": bool(met), "note": note}


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def _f(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.1f}%"
