"""The compute dtype: ``"auto"`` picks bfloat16 where the CPU multiplies it natively, else float32.

bfloat16 halves the bytes every decode step streams (weights and KV) and, on CPUs with AVX512-BF16
or AMX-BF16, runs matmuls several times faster than float32. Elsewhere it multiplies at float32's rate
at best (engine.native widens it on AVX2 + FMA; torch alone emulates it, slower), so ``"auto"`` keeps
the model's own precision there. vLLM's CPU backend makes the same choice. Reuse of cached KV is exact in either
dtype (engine.row_tiles), and bfloat16's fidelity to float32 is measured in the benchmark report.

Example:
    >>> choose_dtype("float32")
    DTypeChoice(dtype='float32', reason='set explicitly')
    >>> choose_dtype("auto", flags={"avx512_bf16": False, "amx_bf16": False}).dtype
    'float32'
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Literal

DType = Literal["auto", "float32", "bfloat16"]
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bfloat16 matmuls
# ISA-narrowing settings under which oneDNN would not use those instructions
_NARROWING_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


@dataclass(frozen=True)
class DTypeChoice:
    """The dtype an engine computes in, and why (``engine.stats()["dtype"]``, ``/server_info``)."""

    dtype: Literal["float32", "bfloat16"]
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"dtype": self.dtype, "reason": self.reason}


@functools.cache
def cpu_bf16_flags() -> dict[str, bool]:
    """Whether this CPU has native bfloat16 matmul instructions, from /proc/cpuinfo (Linux; else none)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        flags = []
    return {flag: flag in flags for flag in BF16_FLAGS}


def choose_dtype(requested: str, flags: dict[str, bool] | None = None) -> DTypeChoice:
    """Resolve ``"auto"`` for this CPU (``flags``: cpu_bf16_flags() by default); an explicit dtype
    stays as given. ValueError for anything else."""
    if requested in ("float32", "bfloat16"):
        return DTypeChoice(requested, "set explicitly")  # type: ignore[arg-type]
    if requested != "auto":
        raise ValueError(f"unsupported dtype {requested!r}; use 'auto', 'float32' or 'bfloat16'")
    flags = cpu_bf16_flags() if flags is None else flags
    present = [f for f in BF16_FLAGS if flags.get(f)]
    if not present:
        return DTypeChoice(
            "float32",
            "auto: this CPU has neither AMX-BF16 nor AVX512-BF16 (bfloat16 would "
            "multiply at float32's rate at best, so the model's own precision)",
        )
    narrowed = [f"{name}={os.environ[name]}" for name in _NARROWING_ENV if os.environ.get(name)]
    if narrowed:
        return DTypeChoice(
            "float32",
            f"auto: the CPU has {', '.join(present)}, but {', '.join(narrowed)} "
            "narrows the instruction set the kernels may use",
        )
    return DTypeChoice("bfloat16", f"auto: the CPU has {', '.join(present)} (native bfloat16 matmuls)")


def bfloat16_emulated() -> str | None:
    """Why torch's bfloat16 matmuls would be emulated in this process (``"auto"`` picks float32), or
    None where the CPU runs them natively."""
    auto = choose_dtype("auto")
    return None if auto.dtype == "bfloat16" else auto.reason.removeprefix("auto: ")


def engine_dtype(requested: str, model_dtype: str) -> DTypeChoice:
    """What an engine built around an already loaded model computes in: the model's dtype, with the
    reason ``requested`` gives when it agrees, else that the caller loaded the model so."""
    wanted = choose_dtype(requested)
    if wanted.dtype == model_dtype:
        return wanted
    return DTypeChoice(
        model_dtype,  # type: ignore[arg-type]
        f"the caller's model is {model_dtype} (config.dtype={requested!r} would load {wanted.dtype})",
    )
