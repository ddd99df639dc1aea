"""The native prefill attention against torch's SDPA in exact-reuse tiles, in one process,
alternating (medians of 5 prefills each): ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python
docs/benchmarks/native/attention_ab.py``. Figures: docs/benchmarks/native/README.md."""

from __future__ import annotations

import statistics
import time

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.isa import cpu_flags


def main() -> None:
    torch.manual_seed(0)
    engine = Engine.from_config(EngineConfig(check_exact_reuse=False))
    runner = engine.runner
    native = runner.attention
    print(engine.stats()["dtype"], engine.stats()["prefill_attention"], "amx_bf16" in cpu_flags())
    ids = torch.randint(100, 40000, (1500,)).tolist()

    def prefill_ms(tokens: int, use_native: bool) -> float:
        runner.attention = native if use_native else None
        buffer = runner.new_buffer(tokens)
        t0 = time.perf_counter()
        for start in range(0, tokens, 1024):  # the engine's prefill chunks
            runner.prefill(ids[start : min(tokens, start + 1024)], buffer)
        return 1000 * (time.perf_counter() - t0)

    for tokens in (500, 1500):
        runs: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(5):
            for use_native in (True, False):
                runs[use_native].append(prefill_ms(tokens, use_native))
        a, b = statistics.median(runs[True]), statistics.median(runs[False])
        print(f"prefill {tokens} tokens: native attention {a:.0f} ms, SDPA tiles {b:.0f} ms ({b / a:.2f}x)")
    runner.attention = native


if __name__ == "__main__":
    main()
