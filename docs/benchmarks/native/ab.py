"""The native decode step against the Python layer loop, in one process, alternating (medians of 15
steps): ``.venv/bin/python docs/benchmarks/native/ab.py`` (add OMP_WAIT_POLICY=PASSIVE for what
`prefixrag serve` runs under). Figures: docs/benchmarks/native/README.md."""

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
    native = runner.native
    print(engine.stats()["dtype"], engine.stats()["decode"], "amx_bf16" in cpu_flags())
    ids = torch.randint(100, 40000, (1500,)).tolist()

    def step_ms(context: int, batch: int, use_native: bool) -> float:
        runner.native = native if use_native else None
        buffers = []
        for _ in range(batch):
            buffer = runner.new_buffer(2048)
            runner.prefill(ids[:context], buffer)
            buffers.append(buffer)
        for _ in range(3):
            runner.decode_batch([500] * batch, buffers)
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            runner.decode_batch([500] * batch, buffers)
            times.append(time.perf_counter() - t0)
        return 1000 * statistics.median(times)

    for _ in range(2):
        for context, batch in ((1500, 1), (64, 1), (300, 4), (300, 8)):
            a, b = step_ms(context, batch, True), step_ms(context, batch, False)
            print(f"context {context}, batch {batch}: native {a:.1f} ms/step, layer loop {b:.1f} ms/step")
    engine.close()


if __name__ == "__main__":
    main()
