"""float32 against bfloat16 on this CPU, in one process, alternating (medians): a cold 1,500-token
prefill, one new token after 1,499 cached, a decode step at 1,500 tokens of context, and greedy
agreement of 24-token answers on a few prompts. ``.venv/bin/python docs/benchmarks/native/dtype_ab.py``
under OMP_WAIT_POLICY=PASSIVE (as `prefixrag serve`). Figures: docs/benchmarks/native/README.md."""

from __future__ import annotations

import statistics
import time

import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.isa import cpu_model

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in one sentence.",
    "List three primary colors.",
]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _round(engine: Engine, ids: list[int]) -> dict[str, float]:
    runner = engine.runner
    buf = runner.new_buffer(1600)
    cold = _timed(lambda: runner.prefill(ids, buf))
    warm = runner.new_buffer(1600)
    runner.prefill(ids[:-1], warm)
    one = _timed(lambda: runner.prefill(ids[-1:], warm))
    steps = [_timed(lambda: runner.decode_batch([500], [buf])) for _ in range(10)]
    return {"cold_s": cold, "one_token_s": one, "decode_ms": 1000 * statistics.median(steps)}


def main() -> None:
    engines = {dtype: Engine.from_config(EngineConfig(dtype=dtype)) for dtype in ("float32", "bfloat16")}
    print(cpu_model())
    for dtype, engine in engines.items():
        stats = engine.stats()
        print(dtype, stats["decode"], stats["prefill_linears"], "exact_reuse", stats["exact_reuse"])
    ids = torch.randint(100, 40000, (1500,), generator=torch.Generator().manual_seed(0)).tolist()
    rounds: dict[str, list[dict[str, float]]] = {dtype: [] for dtype in engines}
    for _ in range(3):
        for dtype, engine in engines.items():
            rounds[dtype].append(_round(engine, ids))
    for dtype, runs in rounds.items():
        medians = {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
        print(dtype, medians)
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    same = 0
    for text in PROMPTS:
        answers = [
            e.generate([{"role": "user", "content": text}], greedy).token_ids for e in engines.values()
        ]
        same += answers[0] == answers[1]
    print(f"identical 24-token greedy answers: {same} of {len(PROMPTS)}")
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
