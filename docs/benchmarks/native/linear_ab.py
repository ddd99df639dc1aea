"""The native tiled Linears against torch's kernels in exact-reuse row tiles (oneDNN's packed kernel
in bfloat16, MKL's in float32), in one process, alternating (medians of 5 prefills each; both runners
with the same attention):
``OMP_WAIT_POLICY=PASSIVE .venv/bin/python docs/benchmarks/native/linear_ab.py [bfloat16|float32]``.
Figures: docs/benchmarks/native/README.md."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from engine.fused import FusedLlamaRunner
from engine.isa import cpu_flags
from engine.models import load_model

CACHED = 1152  # a warm request's cached prefix


def main() -> None:
    torch.manual_seed(0)
    dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    model = load_model(dtype=dtype).model
    runners = {
        "native": FusedLlamaRunner(model, native_linear=True),
        "torch": FusedLlamaRunner(model, native_linear=False),
    }
    print({name: r.linear_kernel for name, r in runners.items()}, "amx_bf16" in cpu_flags())
    ids = torch.randint(100, 40000, (CACHED + 1500,)).tolist()

    def prefill_ms(runner: FusedLlamaRunner, past: int, tokens: int) -> float:
        buffer = runner.new_buffer(past + tokens)
        if past:
            runner.prefill(ids[:past], buffer)
        t0 = time.perf_counter()
        for start in range(past, past + tokens, 1024):  # the engine's prefill chunks
            runner.prefill(ids[start : min(past + tokens, start + 1024)], buffer)
        return 1000 * (time.perf_counter() - t0)

    for past, tokens in ((CACHED, 1), (CACHED, 16), (CACHED, 128), (0, 1500)):
        runs: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(5):
            for name, runner in runners.items():
                runs[name].append(prefill_ms(runner, past, tokens))
        a, b = statistics.median(runs["native"]), statistics.median(runs["torch"])
        print(
            f"{tokens} new tokens after {past} cached: native {a:.1f} ms, torch's tiles {b:.1f} ms ({b / a:.2f}x)"
        )


if __name__ == "__main__":
    main()
