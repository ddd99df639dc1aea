"""The machine's physical limits, measured in the benchmark's own run, and each engine figure as a
share of its limit.

Decode reads every weight and the whole KV cache once per token: it is bound by memory bandwidth, so
its figure is the bytes it streams per token over the time, against a read loop over a buffer larger
than the last-level cache (and a copy loop, which also writes). Prefill is bound by the matmul units:
its figure is the FLOPs of the prompt over the cold TTFT, against a large square GEMM of the same
dtype. Both limits are measured at the engine's thread count, best of a few runs (a busy machine only
adds time).

Example:
    >>> limits = physical_limits(buffer_bytes=64 << 20, matmul_size=256)
    >>> sorted(limits["matmul_gflops"])
    ['bfloat16', 'float32', 'int8']
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from engine.dtype import bfloat16_emulated
from engine.kv.codec import KVGeometry
from engine.native import linear as native_linear
from engine.quant.linear import int8_backend, integer_matmul, pack_for

BUFFER_BYTES = 2 << 30  # larger than any last-level cache here (this project's VMs have up to 300 MB)
MATMUL_SIZE = 2048  # square GEMM: compute-bound for every dtype on CPU
# bfloat16 where the CPU emulates it: orders of magnitude slower, so a smaller product, still compute-bound
EMULATED_SIZE = 512
REPEATS = 5


def bfloat16_not_run() -> str | None:
    """Why the benchmark's bfloat16 rows do not run on this machine (None: they run): they run where
    the CPU multiplies bfloat16 natively or engine.native's kernels widen it (AVX2 + FMA); where torch
    emulates it a prompt's prefill takes minutes."""
    emulated = bfloat16_emulated()
    if emulated is None or native_linear.available(torch.bfloat16):
        return None
    return f"not run, {emulated} and the native kernels need AVX2 and FMA"


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()  # first touch and kernel selection out of the way
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def physical_limits(
    buffer_bytes: int = BUFFER_BYTES, matmul_size: int = MATMUL_SIZE, repeats: int = REPEATS
) -> dict[str, Any]:
    """Memory bandwidth (GB/s: a read loop, a copy loop counting bytes read plus written) and the
    matmul peak (GFLOP/s, int8: GOP/s on the integer matmul int8 weights run on, absent where int8 is
    refused) per dtype, the faster of torch's matmul and the native Linear (``matmul_kernels``), at
    torch's current thread count."""
    with torch.inference_mode():
        read_s, copy_s = _bandwidth(buffer_bytes, repeats)
        n = matmul_size
        peaks: dict[str, float] = {}
        kernels: dict[str, str] = {}
        sizes = {"float32": n, "bfloat16": min(n, EMULATED_SIZE) if bfloat16_emulated() else n}
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            m = sizes[name]
            a, b = torch.randn(m, m).to(dtype), torch.randn(m, m).to(dtype)
            peaks[name], kernels[name] = (
                2 * m**3 / _best(_product(torch.matmul, a, b), repeats) / 1e9,
                "torch",
            )
            native = _native_peak(dtype, n, repeats)
            if native is not None and native > peaks[name]:
                peaks[name], kernels[name], sizes[name] = native, "native", n
        backend = int8_backend()
        if backend is not None:  # the integer matmul int8 weights run on (engine.quant)
            a8 = torch.randint(-63, 64, (n, n), dtype=torch.int8)
            w8 = pack_for(backend, torch.randint(-127, 128, (n, n), dtype=torch.int8), torch.ones(n))
            peaks["int8"] = 2 * n**3 / _best(lambda: integer_matmul(backend, a8, w8), repeats) / 1e9
    return {
        "threads": torch.get_num_threads(),
        "buffer_bytes": buffer_bytes,
        "read_gb_s": buffer_bytes / read_s / 1e9,
        "copy_gb_s": 2 * buffer_bytes / copy_s / 1e9,
        "matmul_size": matmul_size,
        "matmul_sizes": sizes,
        "matmul_gflops": peaks,
        "matmul_kernels": kernels,
    }


def _native_peak(dtype: torch.dtype, n: int, repeats: int) -> float | None:
    """GFLOP/s of engine.native's tiled Linear on ``n x n`` operands (the kernel a prefill runs where
    it is available, as on AVX2-only CPUs where torch emulates bfloat16), or None where it is not."""
    if not native_linear.available(dtype):
        return None
    weight = native_linear.TiledLinear.of(torch.randn(n, n).to(dtype))
    x = torch.randn(n, n).to(dtype)
    return 2 * n**3 / _best(lambda: weight(x), repeats) / 1e9


def _bandwidth(buffer_bytes: int, repeats: int) -> tuple[float, float]:
    """Seconds to read ``buffer_bytes`` (a sum) and to copy them (read and write)."""
    src = torch.ones(buffer_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return _best(src.sum, repeats), _best(lambda: dst.copy_(src), repeats)


def _product(
    op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], a: torch.Tensor, b: torch.Tensor
) -> Callable[[], object]:
    return lambda: op(a, b)


def decode_bytes_per_token(
    weight_bytes: int, embedding_bytes: int, geometry: KVGeometry, dtype_bytes: int, context: int
) -> int:
    """Bytes one decode step streams at ``context`` tokens: every weight but the embedding table (one
    row of it is read) plus every layer's keys and values (in the compute dtype, as attention reads them)."""
    return weight_bytes - embedding_bytes + geometry.raw_bytes_per_token(dtype_bytes) * context


def prefill_flops(linear_params: int, geometry: KVGeometry, heads: int, tokens: int) -> float:
    """Multiply-adds x 2 of a prompt's prefill: every Linear (the lm_head once, for the last token)
    and causal attention (scores and values: about tokens^2 / 2 per head and layer)."""
    attention = 2 * 2 * geometry.layers * heads * geometry.head_dim * tokens * tokens / 2
    return 2 * linear_params * tokens + attention


def shares(engine_figures: dict[str, float], limits: dict[str, Any], dtype: str) -> dict[str, float]:
    """Decode's streamed GB/s and prefill's GFLOP/s, each with its share of the measured limit.

    ``engine_figures``: ``decode_bytes`` (per token), ``decode_s`` (per token), ``prefill_flops``,
    ``cold_s``."""
    decode_gb_s = engine_figures["decode_bytes"] / engine_figures["decode_s"] / 1e9
    prefill_gflops = engine_figures["prefill_flops"] / engine_figures["cold_s"] / 1e9
    peak = limits["matmul_gflops"].get(dtype, float("nan"))
    return {
        "decode_gb_s": decode_gb_s,
        "decode_share_of_read": decode_gb_s / limits["read_gb_s"],
        "decode_share_of_copy": decode_gb_s / limits["copy_gb_s"],
        "prefill_gflops": prefill_gflops,
        "prefill_share_of_peak": prefill_gflops / peak,
    }
