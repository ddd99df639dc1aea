"""The CPU's code paths: what this machine runs natively, and the narrower ISAs it can emulate.

torch's own kernels (``ATEN_CPU_CAPABILITY``), oneDNN (``ONEDNN_MAX_CPU_ISA``) and MKL
(``MKL_ENABLE_INSTRUCTIONS``) each pick their instructions at startup and can be told to use fewer.
A machine with AMX can so run what an AVX-512 CPU without AMX (AMD EPYC Zen 4) runs, and what an
AVX2-only CPU (EPYC Zen 2/3) runs: the numerics tests run under each (tests/engine/test_isa_paths.py),
and the benchmark report names the CPU and the paths exercised. The variables take effect only in a
new process, before the libraries first run.

Example:
    >>> [p.name for p in code_paths({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})]
    ['native', 'avx512-no-amx', 'avx2']
    >>> code_paths({"avx2", "avx512f"})[1].env["ATEN_CPU_CAPABILITY"]
    'avx2'
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from dataclasses import dataclass, field

# the environment variables that narrow each library's instructions (read once, at its first call)
ISA_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
)


def path_key() -> tuple[object, ...]:
    """What decides which kernels run besides the CPU: the thread count, MKL's threading mode and
    the ISA variables."""
    import torch

    return (torch.get_num_threads(), mkl_dynamic(), *(os.environ.get(name, "") for name in ISA_VARIABLES))


def mkl_dynamic() -> int | None:
    """MKL's dynamic-threads flag (None without MKL). ``torch.set_num_threads`` clears it for the
    process and sets MKL threads per calling thread; after that, on MKL's AVX2 path, a GEMM inside
    attention's parallel loop splits its sums by worker thread, so rows stop being offset-invariant
    (the exactness self-check and the tile menus are keyed on this flag, not reused across it)."""
    import torch

    lib = _mkl_library(os.path.dirname(torch.__file__))
    return None if lib is None else int(lib.mkl_serv_get_dynamic())


@functools.cache
def _mkl_library(torch_dir: str) -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(os.path.join(torch_dir, "lib", "libtorch_cpu.so"))
        lib.mkl_serv_get_dynamic.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


@dataclass(frozen=True)
class CodePath:
    """One set of instructions the libraries are limited to (``env`` empty: the CPU's own)."""

    name: str
    description: str
    env: dict[str, str] = field(default_factory=dict)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (``/proc/cpuinfo``; empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_model() -> str:
    """The CPU's model name, e.g. ``Intel(R) Xeon(R) Processor``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def has_fast_bfloat16(flags: frozenset[str] | set[str] | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX-BF16)."""
    flags = cpu_flags() if flags is None else flags
    return "avx512_bf16" in flags or "amx_bf16" in flags


def amx_bf16_usable(flags: frozenset[str] | set[str] | None = None) -> bool:
    """Whether this process may multiply bfloat16 in AMX tiles: the CPU has AMX-BF16 and oneDNN is not
    limited below it (``ONEDNN_MAX_CPU_ISA``: the ``avx512-no-amx`` path emulates a CPU without AMX,
    and the project's own AMX kernels follow it).

    Example:
        >>> amx_bf16_usable({"amx_bf16"}), amx_bf16_usable({"avx512_bf16"})  # doctest: +SKIP
        (True, False)
    """
    flags = cpu_flags() if flags is None else flags
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    limited = limit.upper() not in ("", "ALL", "DEFAULT") and "AMX" not in limit.upper()
    return "amx_bf16" in flags and not limited


def code_paths(flags: frozenset[str] | set[str] | None = None) -> list[CodePath]:
    """The native path, then each narrower one this CPU can emulate."""
    flags = cpu_flags() if flags is None else flags
    paths = [CodePath("native", "the CPU's own instructions")]
    if "amx_bf16" in flags or "amx_int8" in flags:
        isa = "AVX512_CORE_BF16" if "avx512_bf16" in flags else "AVX512_CORE_VNNI"
        paths.append(
            CodePath(
                "avx512-no-amx",
                "AVX-512 without AMX (oneDNN limited; as an AMD EPYC Zen 4 runs)",
                {"ONEDNN_MAX_CPU_ISA": isa},
            )
        )
    if "avx512f" in flags and "avx2" in flags:
        paths.append(
            CodePath(
                "avx2",
                "AVX2 only in torch, oneDNN and MKL (as an AMD EPYC Zen 2/3 runs)",
                {
                    "ATEN_CPU_CAPABILITY": "avx2",
                    "ONEDNN_MAX_CPU_ISA": "AVX2",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                },
            )
        )
    return paths
