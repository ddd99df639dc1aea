"""`prefixrag demo`: ingest the bundled Python reference, ask questions twice, show what the cache saved."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from engine.paths import prefixrag_home
from rag.config import RAGConfig
from rag.ingestion.loaders import load_python_reference
from rag.pipeline import Answer, Pipeline
from rag.stores.compat import INGEST_FIELDS
from rag.types import DEFAULT_COLLECTION
from rag.warming import warm_chunks

DEMO_QUESTIONS = [
    "How do I catch several exception types in one except clause?",
    "What does the with statement do when the block raises an exception?",
    "How are default argument values evaluated in a function definition?",
]
# the same questions phrased differently: they retrieve overlapping chunks in another order, which an
# exact prefix cache cannot reuse past the first chunk that differs, and chunk reuse can
DEMO_REPHRASED = [
    "Which syntax lets a single except clause handle multiple exception classes?",
    "If an exception occurs inside a with block, what happens to the context manager?",
    "When are the default values of function parameters computed?",
]


def default_demo_index() -> Path:
    return prefixrag_home() / "indexes" / "python-reference"


def open_demo_pipeline(
    console: Console, config: RAGConfig, index_dir: Path, topics: int | None = None
) -> Pipeline:
    """Load the saved demo index (re-ingesting changed topics only) or build it with a progress bar;
    ``topics`` keeps only the reference's first n topics; a saved index built with other ingest
    settings than ``config``'s is rebuilt."""
    pipeline = Pipeline.from_config(config.model_copy(update={"index_dir": index_dir}))
    stale = [f for f in INGEST_FIELDS if getattr(pipeline.kb.config, f) != getattr(config, f)]
    if stale:
        console.print(f"[yellow]rebuilding[/] {index_dir}: it was built with other {', '.join(stale)}")
        pipeline = Pipeline.from_config(config.model_copy(update={"index_dir": None}))
    docs = load_python_reference()[:topics]
    t0 = time.perf_counter()
    with console.status("loading the embedder and the tokenizer"):
        pipeline.kb.warm_up()
    pipeline.add_documents(docs, show_progress=True)
    stats = pipeline.kb.last_ingest
    # an index saved before window vectors existed gets them once (the embedding reranker reads them)
    windowed = pipeline.kb.fill_windows(show_progress=True) if pipeline.kb.keeps_windows else 0
    if stats.added or stats.updated or windowed:
        pipeline.save(index_dir)
    console.print(
        f"corpus: Python language reference, {len(docs)} topics, {pipeline.kb.n_chunks} chunks "
        f"({stats.chunks_embedded} embedded now, {time.perf_counter() - t0:.1f} s); index at {index_dir}"
    )
    return pipeline


def run_demo(
    console: Console,
    config: RAGConfig,
    index_dir: Path,
    questions: list[str],
    rephrased: list[str] | None = None,
    *,
    topics: int | None = None,
) -> None:
    """Answer each question twice, then print cold vs warm TTFT and cache hits; then each rephrased
    question in chunks mode (cached chunks reused wherever they stand)."""
    pipeline = open_demo_pipeline(console, config, index_dir, topics)
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
    if rephrased:
        hits = {(h.doc_id, h.chunk_id): h for q in rephrased for h in pipeline.retrieve(q)}
        report = warm_chunks(pipeline.engine, pipeline.assembler, list(hits.values()))
        console.print(
            f"warmed the {report.chunks} chunks the rephrased questions retrieve ({report.warmed} prefilled, "
            f"{report.tokens:,} tokens, {report.seconds:.1f} s): what `prefixrag ingest --warm` does for all"
        )
    for question in rephrased or []:
        rows.append((question, "chunks", pipeline.ask(question, reuse="chunks")))
    console.print(ttft_table(rows))
    stats = pipeline.engine.stats() if hasattr(pipeline.engine, "stats") else {}
    cache = stats.get("cache", {})
    kv = stats.get("kv") or {}
    cold = next(a.timings.prefill_ms for _, run, a in rows if run == "first")
    warm = [a.timings.prefill_ms for _, run, a in rows if run == "again"]
    console.print(
        Panel.fit(
            f"first question cold: [bold]{cold:.0f} ms[/] to first token; repeated questions: "
            f"[bold]{sum(warm) / len(warm):.0f} ms[/] on average ({cold / (sum(warm) / len(warm)):.0f}x faster)\n"
            f"prefix-cache token hit rate {100 * cache.get('hit_rate', 0.0):.0f}%, "
            f"{cache.get('cached_tokens', 0):,} tokens held in {cache.get('used_bytes', 0) / 2**20:.0f} MiB "
            f"({kv.get('bytes_per_token', 0):,} bytes per token, {kv.get('kv_dtype', '?')} KV)\n"
            f"{stats.get('weights', config.engine.weights)} weights, "
            f"{stats.get('weight_bytes', 0) / 2**20:.0f} MiB in memory, computing in "
            f"{_dtype_line(stats.get('dtype'))}\n"
            f"exact reuse on this machine: [bold]{_verdict(stats.get('exact_reuse'))}[/] "
            f"({stats.get('exact_reuse_reason', 'not reported by this engine')})",
            title="prefix cache",
        )
    )
    chunked = [a for _, run, a in rows if run == "chunks"]
    if chunked:
        console.print(chunks_panel(chunked, cold))


def _dtype_line(choice: dict[str, str] | None) -> str:
    """The engine's compute dtype and why (a remote engine does not say)."""
    return f"{choice['dtype']} ({choice['reason']})" if choice else "the remote server's dtype"


def _verdict(exact: bool | None) -> str:
    return {True: "bit-exact", False: "within float rounding", None: "not checked"}[exact]


def chunks_panel(answers: list[Answer], cold_ms: float) -> Panel:
    """What chunks mode reused on the rephrased questions, and what it cost."""
    prompt = sum(a.usage.prompt_tokens for a in answers)
    exact = sum(a.usage.cached_tokens for a in answers)
    stitched = sum(a.usage.stitched_tokens for a in answers)
    recomputed = sum(a.usage.recomputed_tokens for a in answers)
    mean_ms = sum(a.timings.prefill_ms for a in answers) / len(answers)
    mode = answers[0].usage.reuse
    return Panel.fit(
        f"rephrased questions (mode [bold]{mode}[/]): {100 * (exact + stitched) / max(prompt, 1):.0f}% of their "
        f"prompt tokens reused ({100 * exact / max(prompt, 1):.0f}% exact prefix, "
        f"{100 * stitched / max(prompt, 1):.0f}% stitched chunks; {recomputed} chunk tokens recomputed), "
        f"[bold]{mean_ms:.0f} ms[/] to first token on average vs {cold_ms:.0f} ms cold\n"
        "chunk reuse is approximate: the benchmark report measures its fidelity to full prefill",
        title="chunk reuse (reuse='chunks')",
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
        where = src.doc_id if src.collection == DEFAULT_COLLECTION else f"{src.collection}/{src.doc_id}"
        table.add_row(str(n), where, f"{src.score:.2f}", " ".join(src.text.split())[:200])
    console.print(table)


def ttft_table(rows: list[tuple[str, str, Answer]]) -> Table:
    table = Table(title="time to first token, cold vs warm", title_justify="left", expand=True)
    table.add_column("question", overflow="ellipsis", no_wrap=True, ratio=1)
    for col in ("run", "prompt", "cached", "stitched", "hit", "TTFT engine", "end to end"):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    for question, run, a in rows:
        u, t = a.usage, a.timings
        table.add_row(
            question,
            run,
            str(u.prompt_tokens),
            str(u.cached_tokens),
            str(u.stitched_tokens),
            f"{100 * (u.cached_tokens + u.stitched_tokens) / max(u.prompt_tokens, 1):.0f}%",
            f"{t.prefill_ms:.0f} ms",
            f"{t.ttft_ms:.0f} ms",
        )
    return table
