"""prefixrag against vLLM's CPU backend on the same machine and cores (``prefixrag bench-vllm``).

Three parts, each system a server in its own subprocess (a crash is a line in the report):

* **client rows**: the same client code (rag.benchmark.served) against every server: prefixrag at its
  default dtype, in the other dtype (float32 where ``"auto"`` picks bfloat16, else bfloat16) and with
  int8 weights, and vLLM in bfloat16 at each thread binding tried
  (its default, which on 2 cores computes on one and leaves the other to its API server, and every
  core); the better binding (a cold prompt plus a whole answer) is used below;
* **vllm bench serve**: vLLM's own client against both servers, ``prefix_repetition`` and ``random``
  datasets, at each concurrency;
* **the RAG stream**: the benchmark's seeded requests (the chunks section's), each assembled once,
  sent to vLLM with automatic prefix caching through ``engine.RemoteEngine``, and run on prefixrag's
  engine in prefix mode and in chunks mode (every retrieved chunk warmed first), request by request,
  the order rotating.

Example:
    >>> results = run_vllm_bench(VllmBenchConfig.tiny())             # doctest: +SKIP
    >>> results["available"], results["best_binding"]                 # doctest: +SKIP
    (True, '0-1')
"""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.dtype import choose_dtype
from engine.models import DEFAULT_MODEL, load_tokenizer, resolve_model_path
from rag.benchmark.engine_bench import QUESTIONS, rag_context
from rag.benchmark.served import PrefixragServer, client_figures
from rag.benchmark.vllm_peer import SERVED_NAME, VllmServer, cli, vllm_label, vllm_status

Say = Callable[[str], None]
PREFIXRAG = "prefixrag"
SERVE_METRICS = "ttft,tpot,itl,e2el"
BENCH_TIMEOUT_S = 1800


@dataclass(frozen=True)
class VllmBenchConfig:
    """What one comparison runs; ``tiny()`` proves the machinery in about two minutes."""

    repeats: int = 3
    decode_tokens: int = 64
    context_tokens: int = 1500
    bindings: tuple[str, ...] = ("auto", "0-1")
    # prefixrag at its defaults, in the dtype "auto" does not pick here, and with int8 weights
    prefixrag_variants: tuple[tuple[tuple[str, str], ...], ...] = field(default_factory=lambda: _variants())
    datasets: tuple[str, ...] = ("prefix_repetition", "random")
    concurrencies: tuple[int, ...] = (1, 4, 8)
    prompts_per_slot: int = 4  # vllm bench serve: num_prompts = max(8, this x concurrency)
    prefix_len: int = 1024
    suffix_len: int = 128
    prefixes: int = 4
    output_len: int = 64
    stream_requests: int = 24
    eager: bool = False  # vLLM --enforce-eager: starts in ~20 s instead of 60-95 s, slower steps

    @classmethod
    def tiny(cls) -> VllmBenchConfig:
        return cls(
            repeats=1,
            decode_tokens=8,
            bindings=("auto",),
            prefixrag_variants=((),),
            datasets=("prefix_repetition",),
            concurrencies=(2,),
            prompts_per_slot=2,
            prefix_len=256,
            suffix_len=32,
            prefixes=2,
            output_len=8,
            stream_requests=3,
            eager=True,
        )


def _variants() -> tuple[tuple[tuple[str, str], ...], ...]:
    other = "float32" if choose_dtype("auto").dtype == "bfloat16" else "bfloat16"
    return ((), (("dtype", other),), (("weights", "int8"),))


def run_vllm_bench(config: VllmBenchConfig, progress: Say | None = None) -> dict[str, Any]:
    """The comparison's results (plain JSON); ``available: False`` with the reason when vLLM is not built."""
    say = progress or (lambda _msg: None)
    ok, note = vllm_status()
    out: dict[str, Any] = {"available": ok, "note": note, "config": asdict(config), "seconds": {}}
    if not ok:
        return out
    model_dir = Path(resolve_model_path(DEFAULT_MODEL)[1])
    context = rag_context(load_tokenizer(DEFAULT_MODEL), config.context_tokens)
    clock = _Clock(out["seconds"])
    rows: dict[str, Any] = {}
    with clock("client rows"):
        for variant in config.prefixrag_variants:
            server = PrefixragServer(dict(variant))
            rows[server.label] = _guarded(
                functools.partial(_client_row, server, config, context), say, server.label
            )
        for binding in config.bindings:
            vllm = VllmServer(model_dir, threads_bind=binding, eager=config.eager)
            rows[vllm.label] = _guarded(
                functools.partial(_client_row, vllm, config, context), say, vllm.label
            )
    out["rows"] = rows
    best = _best_binding(config, rows)
    out["best_binding"] = best
    if best is None:
        out["serve"] = out["stream"] = None
        return out
    with clock("vllm bench serve"):
        serve: dict[str, Any] = {}
        with PrefixragServer() as ours:
            serve[PREFIXRAG] = _guarded(
                lambda: _serve_runs(ours.base_url, ours.model, model_dir, config, say), say, PREFIXRAG
            )
        with VllmServer(model_dir, threads_bind=best, eager=config.eager) as peer:
            serve[peer.label] = _guarded(
                lambda: _serve_runs(peer.base_url, SERVED_NAME, model_dir, config, say), say, peer.label
            )
            with clock("RAG stream"):
                from rag.benchmark.vllm_stream import run_stream

                out["stream"] = _guarded(
                    lambda: run_stream(peer.base_url, config.stream_requests, say), say, "RAG stream"
                )
        out["serve"] = serve
    return out


def _client_row(server: Any, config: VllmBenchConfig, context: str) -> dict[str, Any]:
    with server:
        row = client_figures(
            server.base_url,
            SERVED_NAME if isinstance(server, VllmServer) else server.model,
            context,
            QUESTIONS,
            config.repeats,
            config.decode_tokens,
        )
        if isinstance(server, VllmServer):
            row["start_s"] = server.started_s
        else:
            row["server_info"] = {k: server.info().get(k) for k in ("dtype", "exact_reuse")}
        return row


def _best_binding(config: VllmBenchConfig, rows: dict[str, Any]) -> str | None:
    """The binding whose cold prompt plus whole answer took least (None: no vLLM server came up)."""
    scores = {}
    for binding in config.bindings:
        row = rows.get(vllm_label("bfloat16", binding)) or {}
        if "error" not in row and row:
            scores[binding] = row["cold_ttft_s"] + config.decode_tokens * row["decode_long_ms"] / 1000
    return min(scores, key=scores.__getitem__) if scores else None


def _serve_runs(
    base_url: str, model: str, model_dir: Path, config: VllmBenchConfig, say: Say
) -> dict[str, Any]:
    """``vllm bench serve`` for every dataset and concurrency against one server."""
    root = base_url.removesuffix("/v1")
    runs: dict[str, Any] = {}
    for dataset in config.datasets:
        for concurrency in config.concurrencies:
            say(f"vllm bench serve: {model} {dataset} at concurrency {concurrency}")
            runs[f"{dataset}@{concurrency}"] = bench_serve(
                root, model, model_dir, dataset, concurrency, config
            )
    return runs


def bench_serve(
    root: str, model: str, model_dir: Path, dataset: str, concurrency: int, config: VllmBenchConfig
) -> dict[str, Any]:
    """One ``vllm bench serve`` run (vLLM's client, from the peer venv); its saved JSON, trimmed."""
    prompts = max(8, config.prompts_per_slot * concurrency)
    data = (
        [
            "--prefix-repetition-prefix-len",
            str(config.prefix_len),
            "--prefix-repetition-suffix-len",
            str(config.suffix_len),
            "--prefix-repetition-num-prefixes",
            str(config.prefixes),
            "--prefix-repetition-output-len",
            str(config.output_len),
        ]
        if dataset == "prefix_repetition"
        else ["--random-input-len", str(config.prefix_len), "--random-output-len", str(config.output_len)]
    )
    with tempfile.TemporaryDirectory() as folder:
        args = [
            *cli(),
            "bench",
            "serve",
            "--backend",
            "openai-chat",
            "--endpoint",
            "/v1/chat/completions",
            "--base-url",
            root,
            "--model",
            model,
            "--tokenizer",
            str(model_dir),
            "--dataset-name",
            dataset,
            *data,
            "--num-prompts",
            str(prompts),
            "--max-concurrency",
            str(concurrency),
            "--ignore-eos",
            "--seed",
            "0",
            "--disable-tqdm",
            "--percentile-metrics",
            SERVE_METRICS,
            "--metric-percentiles",
            "50,95",
            "--save-result",
            "--result-dir",
            folder,
            "--result-filename",
            "result.json",
        ]
        done = subprocess.run(args, capture_output=True, timeout=BENCH_TIMEOUT_S, check=False)
        if done.returncode != 0:
            tail = done.stdout.decode(errors="replace").strip().splitlines()[-6:]
            raise RuntimeError(f"vllm bench serve exited with {done.returncode}: {' | '.join(tail)}")
        result = json.loads((Path(folder) / "result.json").read_text())
    keep = (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "duration",
        "request_throughput",
        "output_throughput",
        "max_concurrency",
    )
    metrics = {
        k: v for k, v in result.items() if k in keep or k.split("_", 1)[0] in ("mean", "median", "p50", "p95")
    }
    return {**metrics, "num_prompts": prompts, "expected_output_tokens": prompts * config.output_len}


def _guarded(run: Callable[[], Any], say: Say, label: str) -> Any:
    """``run()``, or ``{"error": ...}``: a server that fails to start or crashes is a line in the report."""
    try:
        return run()
    except Exception as exc:  # a peer's failure must not end the benchmark
        say(f"{label}: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"[:600]}


class _Clock:
    def __init__(self, into: dict[str, float]) -> None:
        self.into = into

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.into[phase] = self.into.get(phase, 0.0) + time.perf_counter() - t0


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")
