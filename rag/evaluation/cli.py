"""The body of `prefixrag eval-retrieval` (rag/cli.py declares the options and delegates here).

Example:
    >>> eval_retrieval_command(Console(), split="tune", variants=False)   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rag.evaluation.eval_set import SPLITS, EvalQuestion, load_retrieval_eval, read_questions


def eval_retrieval_command(
    console: Console,
    *,
    split: str = "heldout",
    index: Path | None = None,
    questions_file: Path | None = None,
    variants: bool = True,
    rerankers: bool = True,
    resamples: int = 2000,
    json_out: Path | None = None,
) -> dict[str, Any]:
    """Open (or build) the bundled corpus's index, compare every method on ``split`` of the eval set
    (or of ``questions_file``), print the tables and targets, and save the figures as JSON."""
    from rag.config import RAGConfig
    from rag.demo import default_demo_index, open_demo_pipeline
    from rag.evaluation.comparison import compare_methods

    if split not in (*SPLITS, "all"):
        raise ValueError(f"split must be one of {[*SPLITS, 'all']}, got {split!r}")
    questions = _questions(split, questions_file)
    if not questions:
        raise ValueError(f"no questions in split {split!r} of {questions_file or 'the eval set'}")
    kb = open_demo_pipeline(console, RAGConfig(), index or default_demo_index()).kb
    with console.status("evaluating") as status:
        report = compare_methods(
            kb,
            questions,
            split=split,
            variants=variants,
            rerankers=rerankers,
            resamples=resamples,
            progress=lambda name: status.update(f"evaluated {name}"),
        )
    console.print(comparison_table(report))
    console.print(latency_table(report))
    for t in report["targets"]:
        mark = "[green]met[/]" if t["met"] else "[red]missed[/]"
        console.print(f"  {mark}  {t['target']}: {t['value']}")
    if json_out is not None:
        write_json_atomic(json_out, report)
        console.print(f"figures: {json_out}")
    return report


def comparison_table(report: dict[str, Any]) -> Table:
    """One row per method: recall@1/@4/@10 and MRR with 95% intervals, top-4 diversity and tokens."""
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(report["kinds"].items()))
    table = Table(
        title=f"retrieval on the {report['split']} split: {report['questions']} questions ({kinds}), "
        f"{report['chunks']} chunks; [95% bootstrap interval]"
    )
    for name in ("method", "recall@1", "recall@4", "recall@10", "MRR", "docs@4", "coverage@4", "tokens@4"):
        table.add_column(name, justify="left" if name == "method" else "right")
    for row in report["rows"]:
        ci = row["intervals"]
        table.add_row(
            row["name"],
            _with_interval(row["recall"]["1"], ci["recall@1"]),
            _with_interval(row["recall"]["4"], ci["recall@4"]),
            f"{row['recall']['10']:.3f}",
            _with_interval(row["mrr"], ci["mrr"]),
            f"{row['documents4']:.2f}",
            f"{row['coverage4']:.3f}",
            f"{row['context_tokens4']:.0f}",
        )
    return table


def latency_table(report: dict[str, Any]) -> Table:
    """Milliseconds per query at top-4, query embedding included."""
    table = Table(title=f"retrieval latency per query at top-4 ({report['chunks']} chunks)")
    for name in ("method", "queries", "p50 ms", "p95 ms", "embed p50", "search p50"):
        table.add_column(name, justify="left" if name == "method" else "right")
    for name, t in report["latency_ms"].items():
        cells = (t["p50"], t["p95"], t["embed_p50"], t["search_p50"])
        table.add_row(name, str(t["queries"]), *(f"{v:.1f}" for v in cells))
    return table


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temporary file beside ``path``, then move it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _questions(split: str, questions_file: Path | None) -> list[EvalQuestion]:
    if questions_file is None:
        return load_retrieval_eval(split)  # type: ignore[arg-type]  # checked by the caller
    questions = read_questions(questions_file)
    return questions if split == "all" else [q for q in questions if q.split == split]


def _with_interval(value: float, interval: list[float] | tuple[float, float]) -> str:
    return f"{value:.3f} [{interval[0]:.2f}, {interval[1]:.2f}]"
