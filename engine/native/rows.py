"""A prefill's elementwise row operations in one native pass each: RMSNorm, RoPE on the queries and
keys, SiLU(gate) * value (``prefill_rows.cpp`` in bfloat16, ``prefill_rows_f32.cpp`` in float32;
built with the decode step: engine.native.build).

The Python layer loop runs each as several torch operations, each a pass over every row of the
prefill (and, in a server whose OpenMP threads wait passively, a thread wake-up). The native passes
round where those operations round: RoPE gives torch's bits; RMSNorm sums the squares in another
order than torch's mean, and SiLU's exp is not torch's (Sleef's), so a normed value or a SiLU product
can differ from torch's in the last bits (one bfloat16 step, rarely, in bfloat16). A row's result
depends on that row alone, so row tiles, batch mates and thread counts never change it, and reuse
of cached KV stays exact.

They run in bfloat16 where the CPU has AVX512-BF16, and in float32 where the native float32 decode
step runs (AVX2 and FMA); :func:`NativeRows.of` returns None elsewhere, and the torch operations run.

Example:
    >>> rows = NativeRows.of(torch.float32, eps=1e-5)                # doctest: +SKIP
    >>> rows.norm(x, weight).shape == x.shape                        # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.native.build import NativeBuildError, native_module
from engine.native.decode import avx512_bf16_reason, unavailable_reason

log = logging.getLogger(__name__)


class NativeRows:
    """The native row operations, with one model's RMSNorm epsilon.

    Example:
        >>> rows = NativeRows.of(torch.bfloat16, eps=1e-5)                # doctest: +SKIP
        >>> q, k = rows.rope(qkv, cos, sin, heads=9, kv_heads=3)          # doctest: +SKIP
        >>> rows.silu_mul(gate_up).shape[1] == gate_up.shape[1] // 2     # doctest: +SKIP
        True
    """

    def __init__(self, module: Any, eps: float, dtype: torch.dtype = torch.bfloat16) -> None:
        suffix = "_f32" if dtype == torch.float32 else ""
        self._norm = getattr(module, "rms_norm" + suffix)
        self._rope = getattr(module, "rope_qk" + suffix)
        self._silu_mul = getattr(module, "silu_mul" + suffix)
        self.eps = eps

    @classmethod
    def of(
        cls, dtype: torch.dtype, eps: float, widths: tuple[int, int, int] | None = None
    ) -> NativeRows | None:
        """The operations for ``dtype`` on this machine, or None where they cannot run; ``widths``
        (hidden, head dim, intermediate) also rules out a model whose rows the passes cannot split."""
        if unavailable_reason_for(dtype, widths) is not None:
            return None
        try:
            return cls(native_module(), eps, dtype)
        except NativeBuildError as exc:
            log.warning("prefill row operations run as torch operations: %s", exc)
            return None

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``weight * rms_normed(x)`` for ``x [T, hidden]``."""
        out: torch.Tensor = self._norm(x.contiguous(), weight, self.eps)
        return out

    def rope(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated queries ``[T, heads, D]`` and keys ``[T, kv_heads, D]`` from ``qkv [T, (H + 2 KVH) D]``
        (queries, keys, values), ``cos``/``sin`` ``[T, 1, D]``."""
        rows, dim = qkv.shape[0], cos.shape[-1]
        q, k = self._rope(
            qkv.contiguous(),
            cos.reshape(rows, dim).contiguous(),
            sin.reshape(rows, dim).contiguous(),
            heads,
            kv_heads,
        )
        return q, k

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * value`` for ``gate_up [T, 2 I]`` (gate first)."""
        out: torch.Tensor = self._silu_mul(gate_up.contiguous())
        return out


# the multiple each width must be of, for the passes' vectors: (hidden, head dim, intermediate)
WIDTH_MULTIPLES = {torch.bfloat16: (16, 32, 16), torch.float32: (8, 16, 8)}


def unavailable_reason_for(dtype: torch.dtype, widths: tuple[int, int, int] | None = None) -> str | None:
    """Why no native row passes run for ``dtype`` (and a model of these ``widths``) here (None: they do)."""
    if dtype not in WIDTH_MULTIPLES:
        return f"no native row passes compute {str(dtype).removeprefix('torch.')}"
    names = ("hidden size", "head dim", "intermediate size")
    for name, width, multiple in zip(names, widths or (), WIDTH_MULTIPLES[dtype]):
        if width % multiple:
            return f"the {name} {width} is not a multiple of {multiple}"
    if dtype == torch.bfloat16:
        return avx512_bf16_reason()
    return unavailable_reason(torch.float32, True, True)  # the float32 step's AVX2 and FMA
