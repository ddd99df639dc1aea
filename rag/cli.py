"""The `prefixrag` command."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

app = typer.Typer(
    help="prefixrag: retrieval-augmented QA built around prefix KV-cache reuse.", no_args_is_help=True
)
console = Console()

INDEX_HELP = "index directory (default: $PREFIXRAG_HOME/indexes/default)"


def _quiet_libraries() -> None:
    """Keep the terminal for our output: no per-shard progress bars or advisory warnings from HF."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # a library that sets its logger to DEBUG (bm25s) too
        handler.setLevel(logging.WARNING)


def _index_dir(index: Path | None) -> Path:
    from engine.paths import prefixrag_home

    return (index or prefixrag_home() / "indexes" / "default").expanduser()


@app.callback()
def _main() -> None:
    _quiet_libraries()


@app.command()
def ingest(
    paths: list[Path] = typer.Argument(..., help="files (.txt .md .html .pdf) and folders, recursively"),
    index: Path = typer.Option(None, "--index", help=INDEX_HELP),
) -> None:
    """Add documents to an index (unchanged files are skipped; changed ones replace their chunks)."""
    from rag.config import RAGConfig
    from rag.pipeline import Pipeline

    target = _index_dir(index)
    pipeline = Pipeline.from_config(RAGConfig(index_dir=target))
    try:
        result = pipeline.ingest(paths, show_progress=True)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    stats = pipeline.kb.last_ingest
    pipeline.save(target)
    console.print(
        f"{stats.added} added, {stats.updated} updated, {stats.unchanged} unchanged "
        f"({stats.chunks_embedded} chunks embedded, {stats.seconds:.1f} s) -> {target}"
    )
    for skipped in result.skipped:
        console.print(f"[yellow]skipped[/] {skipped.path}: {skipped.reason}")


@app.command()
def ask(
    question: str = typer.Argument(..., help="the question"),
    index: Path = typer.Option(None, "--index", help=INDEX_HELP),
    top_k: int = typer.Option(4, "--top-k", min=1, max=64, help="chunks to ground the answer on"),
    stream: bool = typer.Option(False, "--stream", help="print the answer as it is generated"),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="answer length cap"),
) -> None:
    """Answer a question from an index: answer, sources, TTFT and cached tokens."""
    from rag.config import RAGConfig
    from rag.demo import print_sources, ttft_table
    from rag.pipeline import Pipeline

    target = _index_dir(index)
    pipeline = Pipeline.from_config(RAGConfig(index_dir=target, max_tokens=max_tokens))
    if not len(pipeline.kb):
        console.print(f"[yellow]note:[/] no documents in {target}; answering without sources")
    try:
        answer = None
        for event in pipeline.stream(question, top_k):
            if event.type == "delta" and stream:
                console.print(event.text, end="", soft_wrap=True, highlight=False)
            answer = event.answer or answer
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    assert answer is not None
    console.print() if stream else console.print(answer.text)
    print_sources(console, answer)
    console.print(ttft_table([(question, "once", answer)]))


@app.command()
def demo(
    model: str = typer.Option("smollm2-135m-instruct", help="registry name or HF model dir"),
    index: Path = typer.Option(
        None, "--index", help="demo index dir (default: $PREFIXRAG_HOME/indexes/python-reference)"
    ),
    max_tokens: int = typer.Option(96, "--max-tokens", min=1, help="answer length cap"),
) -> None:
    """Ingest the bundled Python reference, ask questions twice, show cold vs warm TTFT and cache hits."""
    from engine.config import EngineConfig
    from rag.config import RAGConfig
    from rag.demo import DEMO_QUESTIONS, default_demo_index, run_demo

    config = RAGConfig(max_tokens=max_tokens, engine=EngineConfig(model=model))
    run_demo(console, config, index or default_demo_index(), DEMO_QUESTIONS)


@app.command()
def serve(
    host: str = typer.Option(None, help="interface to listen on (env PREFIXRAG_HOST; default 127.0.0.1)"),
    port: int = typer.Option(None, help="TCP port (env PREFIXRAG_PORT; default 8000)"),
    index: Path = typer.Option(
        None,
        "--index",
        help="index directory, loaded and saved (env PREFIXRAG_INDEX_DIR; default: the one `ingest` uses)",
    ),
    model: str = typer.Option(None, help="registry name or HF model dir (env PREFIXRAG_ENGINE__MODEL)"),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve the HTTP API (OpenAI-compatible routes, /v1/ask, documents, metrics) and the web page."""
    from pydantic import ValidationError

    from rag.api.server import serve as run_server
    from rag.api.settings import Settings

    overrides: dict[str, Any] = {"host": host, "port": port, "index_dir": index}
    if model:
        overrides["engine"] = {"model": model}  # merged into PREFIXRAG_ENGINE__* values
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
        if settings.index_dir is None:  # serve what `prefixrag ingest` wrote
            settings = Settings(
                **{k: v for k, v in overrides.items() if v is not None}, index_dir=_index_dir(None)
            )
    except ValidationError as exc:
        console.print(f"[red]invalid settings:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(
        f"serving [bold]{settings.engine.model}[/] on http://{settings.host}:{settings.port} (index {settings.index_dir})"
    )
    run_server(settings, log_level=log_level)


@app.command("bench-router")
def bench_router(
    out: Path = typer.Option(
        Path("bench-results/router"), "--out", help="directory for router.md/.json/.png"
    ),
    requests: int = typer.Option(48, "--requests", min=2, help="requests in the stream"),
    replicas: str = typer.Option("2,3", "--replicas", help="cluster sizes to measure, comma-separated"),
    policies: str = typer.Option("cache_aware,round_robin", "--policies", help="sglang-router policies"),
    concurrency: int = typer.Option(3, "--concurrency", min=1, help="clients sending at once"),
    skew: float = typer.Option(1.2, "--skew", min=0.0, help="Zipf skew of topic popularity"),
    seed: int = typer.Option(0, "--seed", help="workload seed"),
    max_tokens: int = typer.Option(8, "--max-tokens", min=1, help="tokens generated per request"),
    single: bool = typer.Option(True, "--single/--no-single", help="also measure one replica, no router"),
    cache_mib: int = typer.Option(3072, "--cache-mib", min=1, help="prefix-cache budget per replica (MiB)"),
    single_threads: str = typer.Option(
        "",
        "--single-threads",
        help="torch threads of the single replica, comma-separated (default: all cores)",
    ),
) -> None:
    """Token hit rate and TTFT of the RAG workload: one replica vs N behind sglang-router (per policy)."""
    from rag.benchmark.router import RouterBenchConfig, run_router_bench
    from rag.benchmark.router_report import results_table

    try:
        config = RouterBenchConfig(
            requests=requests,
            skew=skew,
            seed=seed,
            concurrency=concurrency,
            max_tokens=max_tokens,
            replicas=tuple(int(n) for n in replicas.split(",") if n.strip()),
            policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
            single=single,
            single_threads=tuple(int(n) for n in single_threads.split(",") if n.strip()),
            cache_bytes=cache_mib << 20,
        )
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    results = run_router_bench(config, out, progress=console.print)
    console.print(results_table(results))
    console.print(f"report: {out / 'router.md'}")


@app.command()
def bench(
    quick: bool = typer.Option(False, "--quick", help="under 3 minutes: fewer requests and measured configs"),
    out: Path = typer.Option(
        Path("bench-results"), "--out", help="directory for report.md, plots, json, csv"
    ),
    requests: int = typer.Option(
        None, "--requests", min=2, help="requests in the stream (default 96; quick 16)"
    ),
    skew: float = typer.Option(None, "--skew", min=0.0, help="Zipf skew of topic popularity (default 1.0)"),
    skews: str = typer.Option(
        None, "--skews", help="comma-separated skews to simulate (default 0.6,1.0,1.4)"
    ),
    seed: int = typer.Option(None, "--seed", help="workload seed (default 0)"),
    tenants: int = typer.Option(None, "--tenants", min=1, help="tenants (cache namespaces; default 1)"),
    turns: int = typer.Option(None, "--turns", min=1, help="turns per conversation (default 1)"),
    samples: int = typer.Option(None, "--samples", min=2, help="caching-off requests measured (default 12)"),
    engine_section: bool = typer.Option(True, "--engine-section/--no-engine-section", help="issue 4 figures"),
    radix_section: bool = typer.Option(True, "--radix-section/--no-radix-section", help="issue 3 figures"),
    retrieval_section: bool = typer.Option(
        None, "--retrieval-section/--no-retrieval-section", help="issue 17 figures (default: on; quick: off)"
    ),
    report_only: bool = typer.Option(
        False, "--report-only", help="redraw plots and report.md from OUT/results.json; measure nothing"
    ),
) -> None:
    """Benchmark prefix-cache hit rate vs TTFT on a RAG workload, against caching off and transformers."""
    from rag.benchmark.cli import bench_command

    bench_command(
        console,
        quick=quick,
        out=out,
        report_only=report_only,
        requests=requests,
        skew=skew,
        skews=skews,
        seed=seed,
        tenants=tenants,
        turns=turns,
        samples=samples,
        engine_section=engine_section,
        radix_section=radix_section,
        retrieval_section=retrieval_section,
    )


@app.command("eval-retrieval")
def eval_retrieval(
    split: str = typer.Option(
        "heldout", "--split", help="tune (choose knobs on it), heldout (report) or all"
    ),
    index: Path = typer.Option(
        None, "--index", help="index of the bundled corpus (default: the demo's; built if missing)"
    ),
    questions: Path = typer.Option(
        None,
        "--questions",
        help="another question file of the same JSON shape (default: rag/data/retrieval_eval.json)",
    ),
    variants: bool = typer.Option(
        True,
        "--variants/--no-variants",
        help="also plain, truncated and multi-vector embeddings (embeds again)",
    ),
    rerankers: bool = typer.Option(True, "--rerankers/--no-rerankers", help="also the embedding reranker"),
    resamples: int = typer.Option(2000, "--resamples", min=100, help="bootstrap resamples per interval"),
    json_out: Path = typer.Option(None, "--json", help="write every figure to this JSON file"),
) -> None:
    """Recall@1/4/10 and MRR (95% bootstrap intervals) of every retrieval method on the eval set."""
    from rag.retrieval.eval_cli import eval_retrieval_command

    try:
        eval_retrieval_command(
            console,
            split=split,
            index=index,
            questions_file=questions,
            variants=variants,
            rerankers=rerankers,
            resamples=resamples,
            json_out=json_out,
        )
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc


@app.command()
def version() -> None:
    """Print the installed version."""
    from importlib.metadata import version as v

    console.print(v("prefixrag"))


if __name__ == "__main__":
    app()
