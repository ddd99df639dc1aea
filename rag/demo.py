"""`prefixrag demo`: ingest the bundled Python reference, ask questions twice, show what the cache saved."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from engine.paths import prefixrag_home
from rag.config import RAGConfig
from rag.ingestion.index_format import INGEST_FIELDS
from rag.ingestion.loaders import load_python_reference
from rag.pipeline import Answer, Pipeline

DEMO_QUESTIONS = [
    "How do I catch several exception types in one except clause?",
    "What does the with statement do when the block raises an exception?",
    "How are default argument values evaluated in a function definition?",
]


def default_demo_index() -> Path:
    return prefixrag_home() / "indexes" / "python-reference"


def open_demo_pipeline(console: Console, config: RAGConfig, index_dir: Path) -> Pipeline:
    """Load the saved demo index (re-ingesting changed topics only) or build it with a progress bar;
    a saved index built with other ingest settings than ``config``'s is rebuilt."""
    pipeline = Pipeline.from_config(config.model_copy(update={"index_dir": index_dir}))
    stale = [f for f in INGEST_FIELDS if getattr(pipeline.kb.config, f) != getattr(config, f)]
    if stale:
        console.print(f"[yellow]rebuilding[/] {index_dir}: it was built with other {', '.join(stale)}")
        pipeline = Pipeline.from_config(config.model_copy(update={"index_dir": None}))
    docs = load_python_reference()
    t0 = time.perf_counter()
    with console.status("loading the embedder and the tokenizer"):
        pipeline.kb.warm_up()
    pipeline.add_documents(docs, show_progress=True)
    stats = pipeline.kb.last_ingest
    if stats.added or stats.updated:
        pipeline.save(index_dir)
    console.print(
        f"corpus: Python language reference, {len(docs)} topics, {pipeline.kb.n_chunks} chunks "
        f"({stats.chunks_embedded} embedded now, {time.perf_counter() - t0:.1f} s); index at {index_dir}"
    )
    return pipeline


def run_demo(console: Console, config: RAGConfig, index_dir: Path, questions: list[str]) -> None:
    """Answer each question twice, then print cold vs warm TTFT and cache hits."""
    pipeline = open_demo_pipeline(console, config, index_dir)
    with console.status(f"loading {config.engine.model}"):
        pipeline.warm_up()
    rows: list[tuple[str, str, Answer]] = []
    for i, question in enumerate(questions, 1):
        console.rule(f"[bold]Question {i}[/]: {question}")
        first = _ask_streaming(console, pipeline, question)
        print_sources(console, first)
        second = pipeline.ask(question)
        rows.append((question, "first", first))
        rows.append((question, "again", second))
    console.print(ttft_table(rows))
    stats = pipeline.engine.stats() if hasattr(pipeline.engine, "stats") else {}
    cache = stats.get("cache", {})
    cold = next(a.timings.prefill_ms for _, run, a in rows if run == "first")
    warm = [a.timings.prefill_ms for _, run, a in rows if run == "again"]
    console.print(
        Panel.fit(
            f"first question cold: [bold]{cold:.0f} ms[/] to first token; repeated questions: "
            f"[bold]{sum(warm) / len(warm):.0f} ms[/] on average ({cold / (sum(warm) / len(warm)):.0f}x faster)\n"
            f"prefix-cache token hit rate {100 * cache.get('hit_rate', 0.0):.0f}%, "
            f"{cache.get('cached_tokens', 0):,} tokens held in {cache.get('used_bytes', 0) / 2**20:.0f} MiB",
            title="prefix cache",
        )
    )


def _ask_streaming(console: Console, pipeline: Pipeline, question: str) -> Answer:
    answer = None
    for event in pipeline.stream(question):
        if event.type == "delta":
            console.print(event.text, end="", soft_wrap=True, highlight=False)
        elif event.answer is not None:
            answer = event.answer
    console.print()
    assert answer is not None
    return answer


def print_sources(console: Console, answer: Answer) -> None:
    table = Table(title="sources", show_lines=False, title_justify="left", expand=True)
    table.add_column("#", justify="right", no_wrap=True, width=3)
    table.add_column("document", no_wrap=True, max_width=24)
    table.add_column("score", justify="right", no_wrap=True, width=6)
    table.add_column("excerpt", overflow="ellipsis", no_wrap=True, ratio=1)
    for n, src in enumerate(answer.sources, 1):
        table.add_row(str(n), src.doc_id, f"{src.score:.2f}", " ".join(src.text.split())[:200])
    console.print(table)


def ttft_table(rows: list[tuple[str, str, Answer]]) -> Table:
    table = Table(title="time to first token, cold vs warm", title_justify="left", expand=True)
    table.add_column("question", overflow="ellipsis", no_wrap=True, ratio=1)
    for col in ("run", "prompt", "cached", "hit", "TTFT engine", "end to end"):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    for question, run, a in rows:
        u, t = a.usage, a.timings
        table.add_row(
            question,
            run,
            str(u.prompt_tokens),
            str(u.cached_tokens),
            f"{100 * u.cached_tokens / max(u.prompt_tokens, 1):.0f}%",
            f"{t.prefill_ms:.0f} ms",
            f"{t.ttft_ms:.0f} ms",
        )
    return table
