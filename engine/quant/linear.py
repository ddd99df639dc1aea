"""Int8 weights: per-output-channel int8 weights times per-row int8 activations, in exact integers.

Every row of ``x`` is scaled by its own absolute maximum and written as two int8 digits, a coarse one
and the rounding residual at twice the resolution (``hi + lo / (2 * levels)``, about 15 bits: one
8-bit step per token costs this model's near-tie answers), and both run as rows of one int8 matmul;
a weight may carry a residual digit too (``quantize_rows(..., residual=True)``: the down projections,
whose rounding moves the answers most). The int8 x int8 products are summed in int32, where addition
is exact in any order, then combined and scaled back elementwise. A token's output therefore depends only on that
token, never on the other rows in the matmul, the row count, the thread count or the kernel: a suffix
prefill equals the same rows of the full prefill and a batched decode equals solo decodes, bit for bit.

That holds only where the kernel's integer sums are exact, which is a property of the CPU's code path,
so it is checked, not assumed (:func:`int8_backend`): on seeded and worst-case operands, at every
shape class the runner uses, against the same operands multiplied in float64, whose integer partial sums are exact.
  * ``onednn`` (``torch._int_mm``: int8 activations at 127 levels): exact where oneDNN has VNNI or AMX
    instructions; without them its 16-bit pair sums saturate;
  * ``fbgemm`` (uint8 activations at 63 levels around zero point 64, so no pair of products can
    exceed 16 bits, in calls of at most ``FBGEMM_ROWS`` rows): the fallback elsewhere.
The first exact backend in :func:`backend_order` is used; with none, :func:`int8_supported` says why and
int8 is refused.

Example:
    >>> w = quantize_weight(torch.randn(960, 576))
    >>> int8_linear(torch.randn(3, 576), w).shape
    torch.Size([3, 960])
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch

from engine.isa import cpu_flags

Int8Backend = Literal["onednn", "fbgemm"]
ONEDNN_LEVELS = 127  # int8 activations: round(v * 127) for v in [-1, 1]
FBGEMM_LEVELS = 63  # uint8 activations: round(v * 63) + 64, in [1, 127]: a product pair fits 16 bits
_FBGEMM_ZERO_POINT = 64
FBGEMM_ROWS = 512  # fbgemm takes another, inexact path for larger calls on some CPUs
_WEIGHT_LEVELS = 127  # symmetric: -127..127, zero point 0
RESCORE_TOP = 32  # int8 logits whose exact float value is recomputed: the greedy pick and most of the mass
_INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # /proc/cpuinfo: int8 dot products
_TINY = torch.finfo(torch.float32).tiny  # an all-zero row divides by this and stays zero
# matmul shapes (rows, in, out) the probe checks: decode rows, one tile, prefill calls, a wide output
_PROBE_SHAPES = ((1, 576, 960), (8, 1536, 576), (16, 576, 8192), (512, 576, 960), (1024, 1536, 576))


@dataclass(frozen=True)
class Int8Weight:
    """A Linear weight ``[out, in]`` as int8 with one float32 scale per output channel, held in the
    form its backend multiplies.

    Example:
        >>> w = quantize_weight(torch.randn(8, 16))
        >>> (w.out_features, w.in_features)
        (8, 16)
    """

    backend: Int8Backend
    q: torch.Tensor  # int8 [out, in], or [2 out, in] with the residual digit's rows after
    scales: torch.Tensor  # float32 [out]
    packed: Any  # fbgemm: torch.classes.quantized.LinearPackedParamsBase, of q's rows
    out_features: int
    in_features: int
    residual: bool = False  # the matrix holds a second, residual digit per weight

    @property
    def nbytes(self) -> int:
        """Bytes held: the int8 matrix or matrices (fbgemm's packed copy besides), and per
        output channel a float scale (fbgemm: and an int32 column offset)."""
        digits = 2 if self.residual else 1
        matrix = digits * self.out_features * self.in_features
        if self.backend == "fbgemm":
            return 2 * matrix + (4 + 4 * digits) * self.out_features
        return matrix + 4 * self.out_features


def int8_supported() -> str | None:
    """Why int8 weights cannot run here (None: they can)."""
    return None if int8_backend() is not None else _why_unsupported()


@functools.cache
def int8_backend() -> Int8Backend | None:
    """The first backend whose integer matmul is exact on this machine (checked once per process)."""
    forced = os.environ.get("PREFIXRAG_INT8_BACKEND")  # for tests of each code path
    for backend in backend_order():
        if forced and backend != forced:
            continue
        if backend_available(backend) and backend_is_exact(backend):
            return backend
    return None


def backend_order(flags: frozenset[str] | None = None) -> tuple[Int8Backend, Int8Backend]:
    """oneDNN first where the CPU has int8 dot-product instructions (VNNI, AMX-INT8) and oneDNN may
    use them; elsewhere fbgemm first, because oneDNN's int8 matmul without them either saturates or,
    exact, runs a reference kernel several times slower than fbgemm's AVX2 one.

    Example:
        >>> backend_order(frozenset({"avx2"}))
        ('fbgemm', 'onednn')
        >>> backend_order(frozenset({"avx2", "avx512_vnni"}))
        ('onednn', 'fbgemm')
    """
    flags = cpu_flags() if flags is None else flags
    limit = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    # oneDNN's ISA names from AVX512_CORE_VNNI up (BF16, AMX) include the int8 dot products
    allowed = limit == "ALL" or any(name in limit for name in ("VNNI", "BF16", "AMX"))
    return ("onednn", "fbgemm") if allowed and flags & _INT8_DOT_FLAGS else ("fbgemm", "onednn")


def _why_unsupported() -> str:
    engines = torch.backends.quantized.supported_engines
    if "fbgemm" not in engines and "x86" not in engines and not hasattr(torch, "_int_mm"):
        return f"int8 weights need fbgemm or oneDNN (an x86 CPU build of torch); this torch has {engines}"
    return (
        "int8 weights refused: on this CPU neither oneDNN's nor fbgemm's int8 matmul reproduces exact "
        "integer sums (the probe in engine.quant compares them with exact float64 sums), so int8 answers "
        "could be wrong; use weights='float32'"
    )


def backend_available(backend: str) -> bool:
    if backend == "onednn":
        return hasattr(torch, "_int_mm")
    engines = torch.backends.quantized.supported_engines
    return "fbgemm" in engines or "x86" in engines


def backend_is_exact(backend: Int8Backend) -> bool:
    """Whether ``backend`` multiplies seeded and worst-case int8 operands exactly at every probe shape."""
    gen = torch.Generator().manual_seed(0)
    levels = ONEDNN_LEVELS if backend == "onednn" else FBGEMM_LEVELS
    for rows, inp, out in _PROBE_SHAPES:
        if backend == "fbgemm" and levels * _WEIGHT_LEVELS * inp >= 2**24:
            return False  # its float32 output could not hold the sum exactly
        weights = [
            torch.randint(-_WEIGHT_LEVELS, _WEIGHT_LEVELS + 1, (out, inp), generator=gen, dtype=torch.int8),
            torch.full((out, inp), _WEIGHT_LEVELS, dtype=torch.int8),
        ]
        acts = [
            torch.randint(-levels, levels + 1, (rows, inp), generator=gen, dtype=torch.int8),
            torch.full((rows, inp), levels, dtype=torch.int8),
        ]
        for q in weights:
            w = pack_for(backend, q, torch.ones(out))
            for a in acts:
                reference = a.double() @ q.double().T  # integer partial sums < 2**53: exact in any order
                got = integer_matmul(backend, a, w).double()
                if not torch.equal(got, reference):
                    return False
    return True


def quantize_rows(weight: torch.Tensor, residual: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [out, in]`` -> (int8 ``[out, in]``, float32 scale per output row ``[out]``); with
    ``residual``, int8 ``[2 out, in]``: the rounding residual's digit (at 1 / (2 * 127) of a step) in
    the rows after, so ``weight ~ scale * (q[:out] + q[out:] / 254)``."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / _WEIGHT_LEVELS).clamp_min(_TINY)
    steps = w / scales[:, None]
    q = torch.round(steps).clamp_(-_WEIGHT_LEVELS, _WEIGHT_LEVELS)
    if residual:  # |steps - q| <= 1/2, so the residual digit stays within -127..127
        q = torch.cat([q, torch.round((steps - q) * 2 * _WEIGHT_LEVELS)])
    return q.to(torch.int8), scales


def pack_int8(q: torch.Tensor, scales: torch.Tensor) -> Int8Weight:
    """An int8 ``[out, in]`` matrix (``[2 out, in]`` with a residual digit) and its per-row scales, in
    the form this machine's backend multiplies."""
    backend = int8_backend()
    if backend is None:
        raise ValueError(_why_unsupported())
    if q.dtype != torch.int8 or q.dim() != 2 or q.shape[0] not in (scales.shape[0], 2 * scales.shape[0]):
        raise ValueError(
            f"expected int8 [out, in] (or [2 out, in]) and [out] scales, got {q.dtype} {tuple(q.shape)} "
            f"/ {tuple(scales.shape)}"
        )
    return pack_for(backend, q, scales)


def pack_for(backend: Int8Backend, q: torch.Tensor, scales: torch.Tensor) -> Int8Weight:
    out, inp = int(scales.shape[0]), int(q.shape[1])
    residual = q.shape[0] == 2 * out
    scales = scales.float().contiguous()
    if backend == "onednn":
        return Int8Weight("onednn", q.contiguous(), scales, None, out, inp, residual)
    rows = q.shape[0]
    zeros = torch.zeros(rows, dtype=torch.long)
    with _fbgemm_engine(), warnings.catch_warnings():
        # torch 2.13 deprecates quantized tensor creation; fbgemm's prepack still takes one
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        unit = torch.ones(rows, dtype=torch.double)  # scales are applied after the digits combine
        qweight = torch._make_per_channel_quantized_tensor(q.contiguous(), unit, zeros, 0)
        packed = torch.ops.quantized.linear_prepack(qweight, None)
    # q stays beside fbgemm's copy: the native kernels tile it (engine.native.int8)
    return Int8Weight("fbgemm", q.contiguous(), scales, packed, out, inp, residual)


def quantize_weight(weight: torch.Tensor, residual: bool = False) -> Int8Weight:
    """Round ``weight [out, in]`` to int8 with a scale per output row and pack it for this machine."""
    return pack_int8(*quantize_rows(weight, residual))


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with a per-row activation scale: row i of the result depends on x[i] only."""
    rows = x.reshape(-1, weight.in_features).float()
    m, n = rows.shape[0], weight.out_features
    peak = torch.linalg.vector_norm(rows, ord=float("inf"), dim=-1, keepdim=True).clamp_min_(_TINY)  # [M, 1]
    levels = ONEDNN_LEVELS if weight.backend == "onednn" else FBGEMM_LEVELS
    steps = rows / peak * levels  # in [-levels, levels]: one fixed quantization step serves every row
    hi = torch.round(steps)
    lo = torch.round((steps - hi) * (2 * levels))  # the residual, |.| <= levels
    acc = integer_matmul(weight.backend, torch.cat([hi, lo]).to(torch.int8), weight).double()  # [2M, N']
    digit = 1.0 / (2 * levels)
    total = acc[:m, :n] + acc[m:, :n] * digit
    if weight.residual:  # the weight's residual digit times the activation's first (lo x lo is below both)
        total += acc[:m, n:] * (1.0 / (2 * _WEIGHT_LEVELS))
    out = total.float().mul_(weight.scales).mul_(peak / levels).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight.out_features)


def integer_matmul(backend: Int8Backend, acts: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
    """int8 ``acts [M, in]`` times the weight's int8 rows ``[N', in]``: the exact integer sums ``[M, N']``."""
    if backend == "onednn":
        return torch._int_mm(acts.contiguous(), weight.q.t())
    # unit activation and weight steps: fbgemm's float32 output is the integer sum itself, exact
    # below 2**24 (63 x 127 x in stays below it for in < 2,097)
    x = acts.float()
    parts = []
    for start in range(0, x.shape[0], FBGEMM_ROWS):
        parts.append(
            torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                x[start : start + FBGEMM_ROWS].contiguous(), 1.0, _FBGEMM_ZERO_POINT, weight.packed
            )
        )
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class _fbgemm_engine:
    """Pack with fbgemm (the 'x86' engine packs Linear weights with fbgemm too)."""

    def __enter__(self) -> None:
        self.previous = torch.backends.quantized.engine
        if self.previous not in ("fbgemm", "x86"):
            torch.backends.quantized.engine = "fbgemm"

    def __exit__(self, *exc: object) -> None:
        torch.backends.quantized.engine = self.previous


def rescore_top(
    logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, k: int = RESCORE_TOP
) -> torch.Tensor:
    """Replace each row's ``k`` largest approximate logits ``[M, V]`` by exact ones from the float
    ``weight [V, d]`` and ``hidden [M, d]``; row i depends on row i only.

    Example:
        >>> w, h = torch.randn(100, 8), torch.randn(2, 8)
        >>> exact = rescore_top(torch.zeros(2, 100), h, w, k=100)
        >>> torch.allclose(exact, h @ w.T, atol=1e-5)
        True
    """
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices  # [M, k]
    exact = (weight[top] * hidden.float()[:, None, :]).sum(dim=-1)  # [M, k]
    return logits.scatter(-1, top, exact)
