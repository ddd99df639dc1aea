"""The `prefixrag` command."""

from __future__ import annotations

import json
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
STORE_HELP = (
    "a shared document store instead of the index directory: postgresql://user:password@host:port/db "
    "(env PREFIXRAG_DOCUMENT_STORE)"
)
STORE_ENV = "PREFIXRAG_DOCUMENT_STORE"
COLLECTION_HELP = "the collection to add to (default: 'default'); e.g. 'shared', which every tenant reads"
# what `serve` and `demo` run when neither --weights nor PREFIXRAG_ENGINE__WEIGHTS says: float32, because
# int8's greedy answers drift from float32's on most prompts (the benchmark's weights section), and an
# answer that changes with a speed flag is opt-in
APP_WEIGHTS = "float32"
WEIGHTS_HELP = "Linear weights: float32, or int8 (quantized once, cached; approximate, fused runner only)"
DTYPE_HELP = "compute dtype: auto (bfloat16 where the CPU has AMX-BF16 or AVX512-BF16, else float32), float32 or bfloat16"


def _quiet_libraries() -> None:
    """Keep the terminal for our output: no per-shard progress bars or advisory warnings from HF."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # a library that sets its logger to DEBUG (bm25s) too
        handler.setLevel(logging.WARNING)


def _index_dir(index: Path | None) -> Path:
    from engine.paths import prefixrag_home

    return (index or prefixrag_home() / "indexes" / "default").expanduser()


def _store_fields(index: Path | None, document_store: str | None) -> dict[str, Any]:
    """The RAGConfig fields naming where documents live: the shared store, else the index directory."""
    if document_store:
        if index is not None:
            console.print("[red]error:[/] --index and --document-store name two stores: give one of them")
            raise typer.Exit(2)
        return {"document_store": document_store}
    return {"index_dir": _index_dir(index)}


def _open_pipeline(config: Any, *, write: bool) -> Any:
    """The pipeline on ``config``'s store (claimed for writing when ``write``), or exit 2 naming
    what is wrong with the store."""
    from rag.pipeline import Pipeline
    from rag.stores import StoreError

    try:
        pipeline = Pipeline.from_config(config)
        if write:
            pipeline.kb.store.claim()  # now, not after embedding: another writer may hold it
    except (StoreError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    return pipeline


def _app_engine(engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """Engine overrides as `serve` runs them: ``engine`` plus the app's weights unless set."""
    engine = dict(engine or {})
    engine.setdefault("weights", os.environ.get("PREFIXRAG_ENGINE__WEIGHTS") or APP_WEIGHTS)
    return engine


def _app_settings() -> Any:
    """The settings `serve` runs with (PREFIXRAG_* variables, the app's weights, the disk KV tier under
    $PREFIXRAG_HOME/kv): what `ingest --warm` and `cache warm` prefill for, so that serve reads it."""
    from rag.api.settings import Settings

    return Settings(engine=_app_engine()).with_disk_cache_default()  # type: ignore[arg-type]


def _read_prompts(path: Path) -> list[Any]:
    """A ``.json`` file's list of prompts (strings, or lists of ``{"role", "content"}`` messages), or a
    text file's non-empty lines; ValueError naming what is wrong."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() != ".json":
        return [line for line in text.splitlines() if line.strip()]
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON list of prompts, got {type(data).__name__}")
    for i, item in enumerate(data):
        messages = isinstance(item, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in item
        )
        if not (isinstance(item, str) or (messages and item)):
            raise ValueError(f"{path}: prompt {i} must be a string or a list of {{role, content}} messages")
    return data


@app.callback()
def _main() -> None:
    _quiet_libraries()


@app.command()
def ingest(
    paths: list[Path] = typer.Argument(..., help="files (.txt .md .html .pdf) and folders, recursively"),
    index: Path = typer.Option(None, "--index", help=INDEX_HELP),
    document_store: str = typer.Option(None, "--document-store", help=STORE_HELP, envvar=STORE_ENV),
    collection: str = typer.Option("default", "--collection", help=COLLECTION_HELP),
    warm: bool = typer.Option(
        False,
        "--warm",
        help="then prefill every chunk's KV for `prefixrag serve` (same PREFIXRAG_* settings) into the disk "
        "KV tier it reads ($PREFIXRAG_HOME/kv by default; resumable, within the RAM cache budget)",
    ),
) -> None:
    """Add documents to a collection of an index (unchanged files are skipped; changed ones replace
    their chunks)."""
    from pydantic import ValidationError

    from rag.config import RAGConfig

    where = _store_fields(index, document_store)
    try:  # warming prefills for the engine `serve` runs, into the disk tier it reads
        config = RAGConfig(**where, engine=_app_settings().engine) if warm else RAGConfig(**where)
    except ValidationError as exc:
        console.print(f"[red]invalid settings:[/] {exc}")
        raise typer.Exit(2) from exc
    pipeline = _open_pipeline(config, write=True)
    try:
        try:
            result = pipeline.ingest(paths, collection=collection, show_progress=True)
        except (FileNotFoundError, ValueError) as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2) from exc
        stats = pipeline.kb.last_ingest
        # chunks indexed before window vectors existed get theirs now, saved with the index directory
        # (the embedding reranker reads them; a shared store's readers fill theirs in memory)
        local = "index_dir" in where
        if local and pipeline.kb.keeps_windows and pipeline.kb.fill_windows(show_progress=True):
            pipeline.save()
        console.print(
            f"{stats.added} added, {stats.updated} updated, {stats.unchanged} unchanged "
            f"({stats.chunks_embedded} chunks embedded, {stats.seconds:.1f} s) -> "
            f"{pipeline.kb.store.location} (collection {collection})"
        )
        for skipped in result.skipped:
            console.print(f"[yellow]skipped[/] {skipped.path}: {skipped.reason}")
        if warm:
            report = pipeline.warm(show_progress=True)
            console.print(warm_summary(report))
    finally:
        pipeline.close()


def warm_summary(report: Any) -> str:
    """One line on a ``WarmReport``."""
    line = (
        f"warmed {report.warmed} chunks ({report.tokens:,} tokens, {report.seconds:.1f} s), "
        f"{report.already_cached} already cached"
    )
    if report.not_fitted:
        line += f", [yellow]{len(report.not_fitted)} did not fit the cache budget[/]"
    return line + (" (cancelled)" if report.cancelled else "")


@app.command()
def ask(
    question: str = typer.Argument(..., help="the question"),
    index: Path = typer.Option(None, "--index", help=INDEX_HELP),
    document_store: str = typer.Option(None, "--document-store", help=STORE_HELP, envvar=STORE_ENV),
    top_k: int = typer.Option(
        None, "--top-k", min=1, max=64, help="chunks to ground the answer on (default: RAGConfig.top_k)"
    ),
    stream: bool = typer.Option(False, "--stream", help="print the answer as it is generated"),
    max_tokens: int = typer.Option(
        None, "--max-tokens", min=1, help="answer length cap (default: RAGConfig.max_tokens)"
    ),
    collection: list[str] = typer.Option(
        None, "--collection", help="search only this collection (repeat for several; default: all)"
    ),
) -> None:
    """Answer a question from an index: answer, sources, TTFT and cached tokens."""
    from pydantic import ValidationError

    from rag.config import RAGConfig
    from rag.demo import print_sources, ttft_table

    try:
        config = RAGConfig(**_store_fields(index, document_store))
    except ValidationError as exc:
        console.print(f"[red]invalid settings:[/] {exc}")
        raise typer.Exit(2) from exc
    pipeline = _open_pipeline(config, write=False)
    collections = collection or None
    try:
        if not pipeline.count_documents(collections):
            where = pipeline.kb.store.location
            where = f"collections {', '.join(collections)} of {where}" if collections else where
            console.print(f"[yellow]note:[/] no documents in {where}; answering without sources")
        answer = None
        params = pipeline.config.sampling_params(max_tokens=max_tokens)
        for event in pipeline.stream(question, top_k, params=params, collections=collections):
            if event.type == "delta" and stream:
                console.print(event.text, end="", soft_wrap=True, highlight=False)
            answer = event.answer or answer
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    finally:
        pipeline.close()
    assert answer is not None
    console.print() if stream else console.print(answer.text)
    print_sources(console, answer)
    console.print(ttft_table([(question, "once", answer)]))


@app.command()
def demo(
    model: str = typer.Option(None, help="registry name or HF model dir (default: the bundled model)"),
    index: Path = typer.Option(
        None, "--index", help="demo index dir (default: $PREFIXRAG_HOME/indexes/python-reference)"
    ),
    max_tokens: int = typer.Option(96, "--max-tokens", min=1, help="answer length cap"),
    topics: int = typer.Option(
        None, "--topics", min=1, help="index only the reference's first N topics (default: all 79)"
    ),
    questions: int = typer.Option(None, "--questions", min=1, help="ask only the first N demo questions"),
    weights: str = typer.Option(APP_WEIGHTS, "--weights", help=WEIGHTS_HELP),
    dtype: str = typer.Option("auto", "--dtype", help=DTYPE_HELP),
) -> None:
    """Ingest the bundled Python reference, ask questions twice, show cold vs warm TTFT and cache hits."""
    from pydantic import ValidationError

    from engine.config import EngineConfig
    from rag.config import RAGConfig
    from rag.demo import DEMO_QUESTIONS, DEMO_REPHRASED, default_demo_index, run_demo

    try:
        chosen = {"model": model} if model else {}  # else EngineConfig's default
        if dtype:
            chosen["dtype"] = dtype
        engine = EngineConfig(weights=weights, **chosen)  # type: ignore[arg-type]
    except ValidationError as exc:
        console.print(f"[red]invalid settings:[/] {exc}")
        raise typer.Exit(2) from exc
    config = RAGConfig(max_tokens=max_tokens, engine=engine)
    run_demo(
        console,
        config,
        index or default_demo_index(),
        DEMO_QUESTIONS[:questions],
        DEMO_REPHRASED[:questions],
        topics=topics,
    )


@app.command()
def serve(
    host: str = typer.Option(None, help="interface to listen on (env PREFIXRAG_HOST; default 127.0.0.1)"),
    port: int = typer.Option(None, help="TCP port (env PREFIXRAG_PORT; default 8000)"),
    index: Path = typer.Option(
        None,
        "--index",
        help="index directory, loaded and saved (env PREFIXRAG_INDEX_DIR; default: the one `ingest` uses)",
    ),
    document_store: str = typer.Option(
        None, "--document-store", help=STORE_HELP + "; every replica on it serves the same documents"
    ),
    model: str = typer.Option(None, help="registry name or HF model dir (env PREFIXRAG_ENGINE__MODEL)"),
    weights: str = typer.Option(
        None, "--weights", help=f"{WEIGHTS_HELP} (env PREFIXRAG_ENGINE__WEIGHTS; default {APP_WEIGHTS})"
    ),
    dtype: str = typer.Option(
        None, "--dtype", help=f"{DTYPE_HELP} (env PREFIXRAG_ENGINE__DTYPE; default auto)"
    ),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve the HTTP API (OpenAI-compatible routes, /v1/ask, documents, metrics) and the web page."""
    from pydantic import ValidationError

    from engine.dtype import choose_dtype
    from rag.api.server import serve as run_server
    from rag.api.settings import Settings
    from rag.config import redact_url
    from rag.stores import StoreError, probe_store

    given: dict[str, Any] = {"host": host, "port": port, "index_dir": index, "document_store": document_store}
    overrides = {k: v for k, v in given.items() if v is not None}
    engine: dict[str, Any] = {"model": model} if model else {}  # merged into PREFIXRAG_ENGINE__* values
    if weights:
        engine["weights"] = weights
    if dtype:
        engine["dtype"] = dtype
    overrides["engine"] = _app_engine(engine)
    try:
        settings = Settings(**overrides)
        if settings.index_dir is None and settings.document_store is None:  # what `ingest` wrote
            settings = Settings(**overrides, index_dir=_index_dir(None))
        probe_store(
            settings.rag.model_copy(
                update={"index_dir": settings.index_dir, "document_store": settings.document_store}
            )
        )
    except ValidationError as exc:
        console.print(f"[red]invalid settings:[/] {exc}")
        raise typer.Exit(2) from exc
    except StoreError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    settings = settings.with_disk_cache_default()
    disk = settings.engine.disk_cache_dir
    chosen = choose_dtype(settings.engine.dtype)
    store = (
        f"document store {redact_url(settings.document_store)}"
        if settings.document_store
        else f"index {settings.index_dir}"
    )
    console.print(
        f"serving [bold]{settings.engine.model}[/] ({chosen.dtype}, {chosen.reason}; "
        f"{settings.engine.weights} Linear weights) on "
        f"http://{settings.host}:{settings.port} ({store}; "
        f"disk KV tier {disk if disk is not None else 'off'})"
    )
    run_server(settings, log_level=log_level)


cache_app = typer.Typer(help="The prefix KV cache: warm it before traffic arrives.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("warm")
def cache_warm(
    prompts: list[str] = typer.Argument(None, help="prompts to prefill (text)"),
    file: Path = typer.Option(
        None,
        "--file",
        help="more prompts: a .json list (each a string or a list of chat messages), else one per line",
    ),
    tenant: str = typer.Option("", "--tenant", help="the tenant whose cache to warm (default: anonymous)"),
) -> None:
    """Prefill prompts (system prompts, FAQ prompts) into the disk KV tier that `prefixrag serve` reads
    (same PREFIXRAG_* settings, $PREFIXRAG_HOME/kv by default)."""
    from pydantic import ValidationError
    from rich.progress import Progress

    from engine import Engine

    try:
        items: list[Any] = list(prompts or []) + (_read_prompts(file) if file is not None else [])
        settings = _app_settings()
    except (OSError, ValueError, ValidationError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    if not items:
        console.print("[red]error:[/] no prompts: pass them as arguments or with --file")
        raise typer.Exit(2)
    with console.status(f"loading {settings.engine.model}"):
        engine = Engine.from_config(settings.engine)
    try:
        with Progress(console=console) as bar:
            task = bar.add_task("warming", total=len(items))
            result = engine.warm(
                items, namespace=tenant, progress=lambda done, _: bar.update(task, completed=done)
            )
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    finally:
        engine.close()
    disk = engine.stats()["disk"]
    where = (
        f"{disk['directory']} ({disk['written_blocks']} blocks written)"
        if disk
        else "RAM only (disk tier off)"
    )
    console.print(
        f"warmed {result.prompts} prompts, {result.prompt_tokens} tokens ({result.cached_tokens} already cached) -> {where}"
    )


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


@app.command("bench-collections")
def bench_collections(
    out: Path = typer.Option(
        Path("bench-results/collections"), "--out", help="directory for collections.md/.json"
    ),
    chunks: int = typer.Option(100_000, "--chunks", min=4, help="vectors in all collections together"),
    collections: int = typer.Option(50, "--collections", min=2, help="collections they are spread over"),
    queries: int = typer.Option(200, "--queries", min=1, help="queries, each timed for every method"),
    bm25: bool = typer.Option(True, "--bm25/--no-bm25", help="also time BM25 per collection vs shared"),
    store: bool = typer.Option(
        True,
        "--store/--no-store",
        help="also the document stores: ingest, a new replica's catch-up, follow latency, search "
        "(the local index directory vs PostgreSQL; a private server unless --store-url)",
    ),
    store_url: str = typer.Option(
        None,
        "--store-url",
        help="an empty PostgreSQL database for the store section (default: a private server)",
    ),
) -> None:
    """Search latency and recall of one tenant's collections: per-collection indexes vs a shared one;
    and the document stores at the same size."""
    import json
    import shlex
    import sys

    from rag.benchmark.collections import CollectionsBenchConfig, run_collections_bench
    from rag.benchmark.collections_report import collections_report, collections_table

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each index build: one per collection

    try:
        config = CollectionsBenchConfig(chunks=chunks, collections=collections, queries=queries, bm25=bm25)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    results = run_collections_bench(config, progress=console.print)
    if store:
        from rag.benchmark.store_bench import StoreBenchConfig, measure_stores

        store_config = StoreBenchConfig(chunks=chunks, collections=collections, queries=queries)
        results["store"] = measure_stores(store_config, store_url, progress=console.print)
    out.mkdir(parents=True, exist_ok=True)
    command = "prefixrag " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    (out / "collections.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    (out / "collections.md").write_text(collections_report(results, command), encoding="utf-8")
    console.print(collections_table(results["dense"]), soft_wrap=True)
    console.print(f"report: {out / 'collections.md'}")


@app.command("bench-vllm")
def bench_vllm(
    out: Path = typer.Option(Path("bench-results/vllm"), "--out", help="directory for vllm.md/.json"),
    tiny: bool = typer.Option(False, "--tiny", help="a tiny run that proves the machinery (~3 min)"),
) -> None:
    """prefixrag against vLLM's CPU backend on this machine (build it first: `make vllm`)."""
    import json
    import shlex
    import sys

    from rag.benchmark.vllm_bench import VllmBenchConfig, run_vllm_bench
    from rag.benchmark.vllm_report import vllm_markdown

    _quiet_libraries()
    config = VllmBenchConfig.tiny() if tiny else VllmBenchConfig()
    results = run_vllm_bench(config, progress=console.print)
    out.mkdir(parents=True, exist_ok=True)
    command = "prefixrag " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    (out / "vllm.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    (out / "vllm.md").write_text(vllm_markdown(results, command), encoding="utf-8")
    console.print(f"report: {out / 'vllm.md'}")
    if not results["available"]:
        console.print(f"[yellow]{results['note']}[/]")


@app.command()
def bench(
    quick: bool = typer.Option(False, "--quick", help="under 3 minutes: fewer requests and measured configs"),
    out: Path = typer.Option(
        Path("bench-results"), "--out", help="directory for report.md, plots, json, csv"
    ),
    requests: int = typer.Option(
        None, "--requests", min=2, help="requests in the stream (default 40; quick 6)"
    ),
    skew: float = typer.Option(None, "--skew", min=0.0, help="Zipf skew of topic popularity (default 1.0)"),
    skews: str = typer.Option(
        None, "--skews", help="comma-separated skews to simulate (default 0.6,1.0,1.4)"
    ),
    seed: int = typer.Option(None, "--seed", help="workload seed (default 0)"),
    tenants: int = typer.Option(None, "--tenants", min=1, help="tenants (cache namespaces; default 1)"),
    turns: int = typer.Option(None, "--turns", min=1, help="turns per conversation (default 1)"),
    samples: int = typer.Option(None, "--samples", min=2, help="caching-off requests measured (default 12)"),
    engine_section: bool = typer.Option(
        True,
        "--engine-section/--no-engine-section",
        help="cold vs warm TTFT, 0%-hit overhead and decode speed on one long RAG prompt",
    ),
    radix_section: bool = typer.Option(
        True, "--radix-section/--no-radix-section", help="the radix tree's match and insert cost on its own"
    ),
    kv_section: bool = typer.Option(
        True, "--kv-section/--no-kv-section", help="KV storage formats and the disk tier"
    ),
    weights_section: bool = typer.Option(
        True, "--weights-section/--no-weights-section", help="int8 vs float32 vs llama.cpp, int8 fidelity"
    ),
    chunks_section: bool = typer.Option(
        True, "--chunks-section/--no-chunks-section", help="chunk reuse: speed and fidelity to full prefill"
    ),
    quality_section: bool = typer.Option(
        True,
        "--quality-section/--no-quality-section",
        help="answer accuracy and agreement with full prefill per setting, on the QA set",
    ),
    quality_questions: int = typer.Option(
        None,
        "--quality-questions",
        min=1,
        help="QA questions the quality section asks (default 12; quick 2; the set holds 207)",
    ),
    full: bool = typer.Option(
        False,
        "--full",
        help="what the committed report ran: the answer-quality comparison on 24 questions with every "
        "recompute strategy at budgets 0.1/0.2/0.3, more rounds in the timed sections (about 45 minutes)",
    ),
    retrieval_section: bool = typer.Option(
        None,
        "--retrieval-section/--no-retrieval-section",
        help="retrieval methods on the held-out questions and the ANN scale run (default: on; quick: off)",
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
        kv_section=kv_section,
        weights_section=weights_section,
        chunks_section=chunks_section,
        quality_section=quality_section,
        quality_questions=quality_questions,
        full=full,
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
    from rag.evaluation.cli import eval_retrieval_command

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
