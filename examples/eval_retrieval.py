"""Recall@1/@4 of every retrieval mode on the labelled questions over the bundled corpus.

Run from the repository root:  python -m examples.eval_retrieval  [--no-baseline]

Builds the knowledge base with the default config (timed), evaluates dense, BM25, hybrid (RRF and
weighted), hybrid + embedding rerank and the default, then, unless --no-baseline, a second index
without title prefixes: the plain MiniLM + FAISS baseline the defaults must beat.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from rag.config import RAGConfig
from rag.retrieval.evaluate import EvalRow, EvalSetting, build_reference_kb, evaluate, load_eval_questions


def _table(rows: list[EvalRow], title: str) -> Table:
    table = Table(title=title)
    for name in ("setting", "recall@1", "recall@4", "ms/query"):
        table.add_column(name, justify="left" if name == "setting" else "right")
    for row in rows:
        table.add_row(row.name, f"{row.recall[1]:.3f}", f"{row.recall[4]:.3f}", f"{row.ms_per_query:.0f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain (untitled) dense baseline")
    args = parser.parse_args()
    console = Console()
    questions = load_eval_questions()

    t0 = time.perf_counter()
    kb = build_reference_kb(show_progress=True)
    ingest_s = time.perf_counter() - t0
    console.print(
        f"corpus: {len(kb)} topics -> {kb.n_chunks} chunks; ingest {ingest_s:.1f} s "
        f"(embedding {kb.last_ingest.seconds:.1f} s incl. chunking); {len(questions)} questions"
    )
    rows = evaluate(kb, questions)
    if not args.no_baseline:
        t0 = time.perf_counter()
        plain = build_reference_kb(RAGConfig(title_in_embedding=False), show_progress=True)
        console.print(f"plain baseline ingest {time.perf_counter() - t0:.1f} s")
        rows += evaluate(plain, questions, [EvalSetting("plain dense baseline (no titles)", "dense")])
    console.print(_table(rows, "retrieval on the bundled Python reference"))
    for row in rows:
        console.print(f"[dim]{row.name} misses@1: {' '.join(row.misses)}[/]")


if __name__ == "__main__":
    main()
