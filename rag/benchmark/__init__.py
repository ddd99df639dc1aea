"""rag.benchmark: `prefixrag bench`, a realistic RAG workload replayed through the whole stack
(and ``router``: `prefixrag bench-router`, replicas behind sglang-router).

Hit rates of every configuration are simulated exactly (a real RadixCache over fake KV of the
engine's bytes per token); the configurations that matter most, caching off and transformers'
generate run for real on the same stream; TTFT of the rest is modelled from the measured fit.

Example:
    >>> from pathlib import Path
    >>> from rag.benchmark import BenchConfig, run_benchmark
    >>> results = run_benchmark(BenchConfig.quick_run(), Path("bench-results"))   # doctest: +SKIP
"""

from rag.benchmark.config import BenchConfig
from rag.benchmark.oracle import PrefixOracle
from rag.benchmark.run import run_benchmark
from rag.benchmark.simulate import FakeKV, SimulatedEngine
from rag.benchmark.workload import WorkloadSpec, build_workload, plan_requests

__all__ = [
    "BenchConfig",
    "FakeKV",
    "PrefixOracle",
    "SimulatedEngine",
    "WorkloadSpec",
    "build_workload",
    "plan_requests",
    "run_benchmark",
]
