"""Int8 weights: per-output-channel int8 weights times per-row int8 activations, on fbgemm.

Every row of ``x`` is scaled by its own absolute maximum before fbgemm quantizes it with one fixed
scale, so each token's activations get a scale of their own and the int32 accumulation is exact.
A token's output therefore depends only on that token, never on the other rows in the matmul:
a suffix prefill equals the same rows of the full prefill, a batched decode equals solo decodes,
bit for bit, whatever the row count or thread count. (fbgemm's dynamic quantization picks one
activation scale per call instead, which would make every row depend on the batch.)

Example:
    >>> w = quantize_weight(torch.randn(960, 576))
    >>> int8_linear(torch.randn(3, 576), w).shape
    torch.Size([3, 960])
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

# activations are mapped to [-1, 1] per row, then to fbgemm's uint8 as round(v * LEVELS) + ZERO_POINT
ACTIVATION_LEVELS = 127
_ZERO_POINT = 128
_WEIGHT_LEVELS = 127  # symmetric: -127..127, zero point 0
RESCORE_TOP = 32  # int8 logits whose exact float value is recomputed: the greedy pick and most of the mass
_TINY = torch.finfo(torch.float32).tiny  # an all-zero row divides by this and stays zero


@dataclass(frozen=True)
class Int8Weight:
    """A Linear weight ``[out, in]`` packed for fbgemm with one float32 scale per output channel.

    Example:
        >>> w = quantize_weight(torch.randn(8, 16))
        >>> (w.out_features, w.in_features)
        (8, 16)
    """

    packed: Any  # torch.classes.quantized.LinearPackedParamsBase
    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        """Bytes held: fbgemm keeps the packed matrix and the int8 original it was packed from,
        plus a float scale and an int32 column offset per output channel."""
        return 2 * self.out_features * self.in_features + 8 * self.out_features


def int8_supported() -> str | None:
    """Why int8 weights cannot run here (None: they can)."""
    engines = torch.backends.quantized.supported_engines
    if "fbgemm" not in engines and "x86" not in engines:
        return f"int8 weights need fbgemm (an x86 CPU build of torch); this torch has {engines}"
    return None


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [out, in]`` -> (int8 ``[out, in]``, float32 scale per output row ``[out]``)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / _WEIGHT_LEVELS).clamp_min(_TINY)
    q = torch.round(w / scales[:, None]).clamp_(-_WEIGHT_LEVELS, _WEIGHT_LEVELS).to(torch.int8)
    return q, scales


def pack_int8(q: torch.Tensor, scales: torch.Tensor) -> Int8Weight:
    """Pack an int8 ``[out, in]`` matrix and its per-row scales for fbgemm."""
    reason = int8_supported()
    if reason:
        raise ValueError(reason)
    if q.dtype != torch.int8 or q.dim() != 2 or scales.shape != (q.shape[0],):
        raise ValueError(
            f"expected int8 [out, in] and [out] scales, got {q.dtype} {q.shape} / {scales.shape}"
        )
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with _fbgemm_engine(), warnings.catch_warnings():
        # torch 2.13 deprecates quantized tensor creation; fbgemm's prepack still takes one
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        qweight = torch._make_per_channel_quantized_tensor(q.contiguous(), scales.double(), zeros, 0)
        packed = torch.ops.quantized.linear_prepack(qweight, None)
    return Int8Weight(packed=packed, out_features=int(q.shape[0]), in_features=int(q.shape[1]))


def quantize_weight(weight: torch.Tensor) -> Int8Weight:
    """Round ``weight [out, in]`` to int8 with a scale per output row and pack it for fbgemm."""
    return pack_int8(*quantize_rows(weight))


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with a per-row activation scale: row i of the result depends on x[i] only."""
    rows = x.reshape(-1, weight.in_features).float()
    peak = torch.linalg.vector_norm(rows, ord=float("inf"), dim=-1, keepdim=True).clamp_min_(_TINY)  # [M, 1]
    # rows / peak is in [-1, 1]: one fixed quantization scale serves every row
    out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        (rows / peak).contiguous(), 1.0 / ACTIVATION_LEVELS, _ZERO_POINT, weight.packed
    )
    out = out.mul_(peak).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight.out_features)


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
