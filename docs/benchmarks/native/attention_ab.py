"""The native prefill attention against torch's SDPA in exact-reuse tiles, in one process,
alternating (medians of 5 prefills each), at the engine's default dtype or the one given:
``OMP_WAIT_POLICY=PASSIVE .venv/bin/python docs/benchmarks/native/attention_ab.py [float32]``.
Figures: docs/benchmarks/native/README.md."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.isa import cpu_flags

CACHED = 1152  # a warm request's cached prefix


def main() -> None:
    torch.manual_seed(0)
    dtype = sys.argv[1] if len(sys.argv) > 1 else "auto"
    engine = Engine.from_config(EngineConfig(check_exact_reuse=False, dtype=dtype))
    runner = engine.runner
    native = runner.attention
    print(engine.stats()["dtype"], engine.stats()["prefill_attention"], "amx_bf16" in cpu_flags())
    ids = torch.randint(100, 40000, (CACHED + 1500,)).tolist()

    def prefill_ms(past: int, tokens: int, use_native: bool) -> float:
        runner.attention = native if use_native else None
        buffer = runner.new_buffer(past + tokens)
        if past:
            runner.prefill(ids[:past], buffer)
        t0 = time.perf_counter()
        for start in range(past, past + tokens, 1024):  # the engine's prefill chunks
            runner.prefill(ids[start : min(past + tokens, start + 1024)], buffer)
        return 1000 * (time.perf_counter() - t0)

    for past, tokens in ((CACHED, 1), (CACHED, 16), (0, 500), (0, 1500)):
        runs: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(5):
            for use_native in (True, False):
                runs[use_native].append(prefill_ms(past, tokens, use_native))
        a, b = statistics.median(runs[True]), statistics.median(runs[False])
        print(
            f"{tokens} new tokens after {past} cached: native attention {a:.1f} ms, SDPA tiles {b:.1f} ms ({b / a:.2f}x)"
        )
    runner.attention = native


if __name__ == "__main__":
    main()
