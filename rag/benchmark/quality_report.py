"""The answer-quality section of the report: a table per setting, accuracy by fact position, targets.

Example:
    >>> print(quality_markdown({"quality_section": None}))
    ## Answer quality on the QA set
    <BLANKLINE>
    Not run (`--no-quality-section`).
"""

from __future__ import annotations

import math
from typing import Any

from rag.benchmark.quality_settings import REFERENCE

TITLE = "Answer quality on the QA set"


def quality_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 26's targets, met or not, with the values."""
    rows = section["settings"]
    ref = rows[REFERENCE]
    out = []
    default = next((r for r in rows.values() if r.get("default_chunks")), None)
    if default is not None:
        ratio = default["accuracy"] / ref["accuracy"] if ref["accuracy"] else math.nan
        speedup = ref["ttft_s_mean"] / default["ttft_s_mean"] if default["ttft_s_mean"] else math.nan
        out += [
            _target(
                f"chunks mode after warming ({default['setting']}): accuracy >= 98% of full prefill's",
                ratio,
                ratio >= 0.98,
                f"{_pct(default['accuracy'])} vs {_pct(ref['accuracy'])}",
            ),
            _target(
                f"chunks mode: first {section['agreement_tokens']} answer tokens equal full prefill's on "
                ">= 60% of questions",
                default["agreement"],
                default["agreement"] >= 0.60,
            ),
            _target("chunks mode: mean TTFT >= 5x lower than full prefill's", speedup, speedup >= 5),
        ]
    for name, row in rows.items():
        if row["group"] == "order" and row.get("questions"):
            out.append(
                _target(
                    f"{name}: accuracy within full prefill's 95% interval (same questions)",
                    row["accuracy"],
                    _within(row),
                    f"full prefill {_pct(row.get('reference_accuracy'))} {_ci(row.get('reference_ci'))}; "
                    f"token hit rate {_pct(row['hit_rate'])}",
                )
            )
    for name, row in rows.items():
        if row["group"] == "retrieval" and row.get("questions"):
            out.append(_reranker_target(name, row))
    return out


def _reranker_target(name: str, row: dict[str, Any]) -> dict[str, Any]:
    """The reranker's answer accuracy against the first stage alone, on the corpus questions; the row
    is the reranked one where the default does not rerank, the first stage alone where it does."""
    with_it, without = (row["accuracy"], row["reference_accuracy"])
    if row.get("rerank") is False:  # the reference reranks
        with_it, without = without, with_it
    who = "the embedding reranker (default)" if row.get("rerank") is False else name
    return _target(
        f"{who}: answer accuracy no lower than without it (same questions)",
        with_it - without,
        with_it >= without,
        f"{_pct(with_it)} with it vs {_pct(without)} without",
    )


def quality_markdown(res: dict[str, Any]) -> str:
    section = res.get("quality_section")
    if not section:
        return f"## {TITLE}\n\nNot run (`--no-quality-section`)."
    return "\n\n".join(
        [
            _intro(section),
            _table(section),
            _positions(section),
            _targets_table(quality_targets(section)),
        ]
    )


def _intro(s: dict[str, Any]) -> str:
    kinds, warm = s["kinds"], s["warm"]
    return "\n".join(
        [
            f"## {TITLE}",
            "",
            f"{s['questions']} questions of `rag/data/qa_eval.json` ({kinds['corpus']} single-fact questions on the "
            f"bundled corpus, retrieved by the pipeline; {kinds['fact']} made-up facts at every chunk position among "
            f"real distractor chunks; {kinds['two_fact']} questions whose answer needs two chunks), one seeded "
            "stream. An answer is correct when it contains every expected value (normalised whole-word match, no "
            f"model judges). Greedy answers of up to {s['answer_tokens']} tokens with the pipeline's sampling; "
            f"'first {s['agreement_tokens']} equal' and 'whole equal' compare a setting's answer tokens with full "
            f"prefill's; KL is the mean KL(full prefill || setting) over full prefill's first {s['kl_positions']} "
            "answer positions, teacher-forced. The deviation estimate is the engine's own, per request "
            "(`usage.stitch_deviation`: the question's attention share on stitched chunk KV), with its rank "
            "correlation with KL over the questions. TTFT is the engine's (prefill, queue excluded). Intervals are 95% "
            "bootstrap intervals over questions; 'vs full prefill' is the paired difference on the same questions. "
            f"Rows marked * ran on an evenly spread slice of {s['matrix_questions']} questions. Warming prefilled "
            f"{warm['warmed']} chunk placements ({warm['tokens']:,} tokens) in {warm['seconds']:.0f} s; the "
            f"section took {s['seconds'] / 60:.1f} min.",
            *(f"Row '{name}': {why}." for name, why in s.get("not_run", {}).items()),
        ]
    )


def _table(s: dict[str, Any]) -> str:
    k = s["agreement_tokens"]
    lines = [
        f"| setting | questions | accuracy [95% CI] | vs full prefill [95% CI] | first {k} equal | whole equal "
        "| KL (nats) | TTFT mean / p50 | token hit rate | reused (exact + stitched) | recomputed of stitched "
        "| deviation estimate (rank corr. with KL) |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in s["settings"].items():
        if not r.get("questions"):
            continue
        star = "*" if r["matrix"] else ""
        lines.append(
            f"| {name}{star} | {r['questions']} | {_pct(r['accuracy'])} {_ci(r['accuracy_ci'])} "
            f"| {_signed(r['vs_reference'])} {_ci(r['vs_reference_ci'], signed=True)} | {_pct(r['agreement'])} "
            f"| {_pct(r['exact'])} | {_num(r['kl_mean'], 4)} | {_num(r['ttft_s_mean'], 2)} / "
            f"{_num(r['ttft_s_p50'], 2)} s | {_pct(r['hit_rate'])} | {_pct(r['reuse_share'])} "
            f"| {_pct(r['recomputed_share']) if r['reuse'] == 'chunks' else '-'} | {_estimate(r)} |"
        )
    return "\n".join(lines)


def _positions(s: dict[str, Any]) -> str:
    """Accuracy on the single-fact synthetic questions by the fact's chunk position."""
    rows = [(name, r) for name, r in s["settings"].items() if r.get("by_position") and not r["matrix"]]
    positions = sorted({p for _, r in rows for p in r["by_position"]}, key=int)
    if not positions:
        return ""
    head = " | ".join(f"position {p}" for p in positions)
    lines = [
        "Accuracy on the single-fact synthetic questions by the fact chunk's position in the prompt (1: right "
        "after the system prompt; the last: next to the question), as each setting laid the prompt out:",
        "",
        f"| setting | {head} |",
        "|---|" + "---:|" * len(positions),
    ]
    for name, r in rows:
        cells = [r["by_position"].get(p) for p in positions]
        lines.append(
            f"| {name} | "
            + " | ".join(f"{_pct(c['accuracy'])} ({c['questions']})" if c else "-" for c in cells)
            + " |"
        )
    return "\n".join(lines)


def _estimate(r: dict[str, Any]) -> str:
    if r["reuse"] != "chunks":
        return "-"
    return f"{_num(r['deviation_mean'], 3)} ({_num(r['deviation_kl_spearman'], 2)})"


def _targets_table(targets: list[dict[str, Any]]) -> str:
    lines = ["| target | value | met | note |", "|---|---:|---|---|"]
    for t in targets:
        lines.append(
            f"| {t['target']} | {_num(t['value'], 3)} | {'yes' if t['met'] else 'no'} | {t['note']} |"
        )
    return "\n".join(lines)


def _within(row: dict[str, Any]) -> bool:
    """The row's accuracy inside full prefill's interval on the same questions."""
    lo, hi = row.get("reference_ci", (0.0, 1.0))
    return bool(lo <= row["accuracy"] <= hi)


def _target(target: str, value: Any, met: bool, note: str = "") -> dict[str, Any]:
    return {"target": target, "value": value, "met": bool(met), "note": note}


def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def _signed(v: Any) -> str:
    return "-" if v is None or math.isnan(v) else f"{100 * v:+.1f} pt"


def _ci(ci: Any, signed: bool = False) -> str:
    if not ci:
        return ""
    lo, hi = ci
    fmt = "{:+.1f}" if signed else "{:.1f}"
    return f"[{fmt.format(100 * lo)}, {fmt.format(100 * hi)}]"


def _num(v: Any, digits: int) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"
