"""A prefill's causal attention in one native call per layer (``prefill_attention.cpp`` in bfloat16,
``prefill_attention_f32.cpp`` in float32, built with the decode step: engine.native.build).

torch's attention kernel rounds a query's result differently with the call's shape, so exact reuse
runs it over whole 512-key blocks under an explicit mask (engine.prefill_shapes): a 1,500-token
prompt computes every score of its 1,500 x 1,536 square, masked half included. The native kernels
walk each query row's keys in 64-key blocks at fixed absolute positions, up to its own position
only, with a float32 online softmax (bfloat16: AVX512-BF16 dot products; float32: AVX2 fused
multiply-adds). A row's result depends on its query, its position and the keys and values at
positions up to it alone, so a prompt computed whole or split anywhere, with any thread count, gives
every row the same bits, and it reads half the scores. Their sums run in another order than torch's,
so results are close to SDPA's, not equal (tests/engine/native/test_attention.py measures both).

bfloat16 runs AMX's kernel where the CPU has AMX-BF16 (``prefill_attention_amx.cpp``: the blocks'
scores and whole-block value sums in AMX tiles, the softmax as the AVX512-BF16 kernel's), else
AVX512-BF16's where the CPU has it, else the float32 kernel over the bfloat16 queries, keys and
values widened as they are read (its output rounded to bfloat16), over a bfloat16 KV store. The
three give different bits, so a runner holds one for every call (:attr:`NativeAttention.name`, in
its kernel signature). float32 runs wherever AVX2 and FMA do, over a float32 KV store. A runner uses
whichever runs here unless told not to; :meth:`NativeAttention.of` returns None where none can run.

Example:
    >>> attn = NativeAttention.of(torch.bfloat16, head_dim=64)             # doctest: +SKIP
    >>> out = attn(q, k_store[layer, 0], v_store[layer, 0], positions, scale)  # [T, H * D]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.native.build import NativeBuildError, native_module
from engine.native.decode import avx512_bf16_reason, unavailable_reason
from engine.native.linear import amx_available

log = logging.getLogger(__name__)

HEAD_DIMS = (64, 128)  # what the kernel is compiled for


class NativeAttention:
    """Causal attention of query rows at explicit ascending positions over one layer's KV store.

    Example:
        >>> attn = NativeAttention.of(torch.bfloat16, head_dim=64)        # doctest: +SKIP
        >>> attn(q, keys, values, torch.arange(past, past + len(q)), 0.125).shape  # doctest: +SKIP
        torch.Size([T, H * D])
    """

    def __init__(self, module: Any, dtype: torch.dtype = torch.bfloat16, amx: bool = True) -> None:
        self._module = module
        self.dtype = dtype  # of the queries and the KV store it reads
        wide = dtype == torch.bfloat16 and avx512_bf16_reason() is None
        # which kernel: "amx", "avx512-bf16" or "float32" (their bits differ)
        self.name = ("amx" if amx and amx_available() else "avx512-bf16") if wide else "float32"
        kernels = {"amx": "attend_rows_amx", "avx512-bf16": "attend_rows", "float32": "attend_rows_f32"}
        self._kernel = getattr(module, kernels[self.name])

    @classmethod
    def of(cls, dtype: torch.dtype, head_dim: int, amx: bool = True) -> NativeAttention | None:
        """The kernel for ``dtype`` and ``head_dim`` on this machine (AMX's where it runs, unless
        ``amx=False``), or None where none can run."""
        if dtype not in (torch.bfloat16, torch.float32) or head_dim not in HEAD_DIMS:
            return None
        if unavailable_reason(torch.float32, True, True) is not None:  # AVX2 + FMA, whatever the dtype
            return None
        try:
            return cls(native_module(), dtype, amx)
        except NativeBuildError as exc:
            log.warning("prefill attention runs torch's kernel: %s", exc)
            return None

    def __call__(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        positions: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """``q [T, H, D]`` (row i at ``positions[i]``) over ``keys``/``values`` ``[KVH, capacity, D]``
        up to each row's position -> ``[T, H * D]``."""
        out: torch.Tensor = self._kernel(q.contiguous(), keys, values, positions, scale)
        return out
