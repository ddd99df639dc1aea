"""The exactness section of `prefixrag bench`: the CPU, the code paths exercised and the engine's
verdict on each, what the exact prefill shapes cost, and the int8 kernels side by side.

* code paths: for the native path and each narrower one the CPU can emulate (engine.isa), a fresh
  process runs ``python -m engine.exact_reuse`` (the self-check for the fused runner in float32 and
  bfloat16, with int8 weights, and the transformers runner) and reports its verdicts and tile menus;
  a process that fails is a line in the report;
* cost: the same ~1,500-token prompt through a runner with the calibrated tiles (``exact_shapes``) and
  one without (each matmul and key-block span in one call), side by side, rounds interleaved: cold
  prefill, a one-token warm suffix and a 20-token one;
* int8 kernels: oneDNN's ``_int_mm`` and fbgemm on the model's projection shapes, each checked
  against float64 sums and timed.

Example:
    >>> section = run_exactness_bench(loaded, repeats=3)             # doctest: +SKIP
    >>> section["paths"][0]["runners"]["fused float32"]["exact_reuse"]  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from engine.fused import FusedLlamaRunner
from engine.isa import code_paths, cpu_flags, cpu_model
from engine.models import LoadedModel, load_model
from engine.quant.linear import (
    Int8Backend,
    backend_available,
    backend_is_exact,
    integer_matmul,
    pack_for,
    quantize_rows,
)
from rag.benchmark.limits import bfloat16_not_run

FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx_vnni")
_KERNEL_SHAPES = ((1, 576, 960), (1, 1536, 576), (1024, 576, 3072), (1024, 1536, 576))
SLOW_CALL_MS = 250.0


def run_exactness_bench(
    loaded: LoadedModel,
    *,
    repeats: int = 3,
    context_tokens: int = 1500,
    all_paths: bool = True,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """The section's results (plain JSON-able data)."""
    flags = cpu_flags()
    out: dict[str, Any] = {
        "cpu": cpu_model(),
        "flags": [f for f in FLAGS_OF_INTEREST if f in flags],
        "threads": torch.get_num_threads(),
        "paths": [],
    }
    for path in code_paths() if all_paths else code_paths()[:1]:
        progress(f"exactness on the {path.name} path")
        out["paths"].append(
            {"name": path.name, "description": path.description, "env": path.env, **_survey(path.env)}
        )
    progress("cost of the exact shapes")
    not_run = bfloat16_not_run()
    dtypes = ("float32",) if not_run else ("float32", "bfloat16")
    out["cost"] = {dtype: _shape_cost(dtype, loaded, repeats, context_tokens) for dtype in dtypes}
    if not_run:
        out["cost_not_run"] = {"bfloat16": not_run}
    progress("int8 kernels")
    out["int8_kernels"] = _int8_kernels(repeats)
    return out


def _survey(env: dict[str, str]) -> dict[str, Any]:
    """One code path's verdicts, from a fresh process (the variables act only before the libraries load)."""
    cmd = [sys.executable, "-m", "engine.exact_reuse"]
    try:
        proc = subprocess.run(
            cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=900, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 900 s"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _shape_cost(dtype: str, loaded: LoadedModel, repeats: int, tokens: int) -> dict[str, Any]:
    """Median ms of cold / warm (1 token) / 20-token-suffix prefills, exact shapes against one call."""
    model = loaded.model if dtype == "float32" else load_model(loaded.model_id, dtype=dtype).model
    runners = {"exact": FusedLlamaRunner(model), "one call": FusedLlamaRunner(model, exact_shapes=False)}
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(100, 30_000, (tokens,), generator=gen).tolist()
    times: dict[str, dict[str, list[float]]] = {
        name: {"cold": [], "warm": [], "last_20": []} for name in runners
    }
    for _ in range(repeats):
        for name, runner in runners.items():  # interleaved: the machine's load hits both alike
            full = runner.new_buffer(tokens)
            times[name]["cold"].append(_ms(_chunked, runner, ids, full))
            for label, suffix in (("warm", 1), ("last_20", 20)):
                buffer = runner.new_buffer(tokens)
                buffer.load_prefix([full.segment(0, tokens - suffix)])
                times[name][label].append(_ms(runner.prefill, ids[-suffix:], buffer))
    medians = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    return {
        "prompt_tokens": tokens,
        "ms": medians,
        "ratio": {k: medians["exact"][k] / medians["one call"][k] for k in medians["exact"]},
    }


def _chunked(runner: FusedLlamaRunner, ids: list[int], buffer: Any, chunk: int = 1024) -> None:
    for start in range(0, len(ids), chunk):
        runner.prefill(ids[start : start + chunk], buffer)


def _ms(fn: Callable[..., Any], *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - t0) * 1000


def _int8_kernels(repeats: int) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(2)
    rows = []
    backends: tuple[Int8Backend, ...] = ("onednn", "fbgemm")
    for backend in backends:
        if not backend_available(backend):
            rows.append({"backend": backend, "available": False})
            continue
        row: dict[str, Any] = {
            "backend": backend,
            "available": True,
            "exact": backend_is_exact(backend),
            "ms": {},
        }
        for m, k, n in _KERNEL_SHAPES:
            q, scales = quantize_rows(torch.randn(n, k, generator=gen))
            w = pack_for(backend, q, scales)
            acts = torch.randint(-63, 64, (2 * m, k), generator=gen, dtype=torch.int8)  # two digits per row
            first = _ms(integer_matmul, backend, acts, w)  # warm-up
            # a call this slow (oneDNN's reference path on AVX2: seconds) is its own figure: its
            # first-call setup is noise beside it, and a second call would only double the wait
            rounds = max(repeats, 3) if first < SLOW_CALL_MS else 0
            samples = [_ms(integer_matmul, backend, acts, w) for _ in range(rounds)] or [first]
            row["ms"][f"{m}x{k}x{n}"] = statistics.median(samples)
        rows.append(row)
    return rows
