"""A prefill's causal attention in one native call per layer (``prefill_attention.cpp``, built with
the decode step: engine.native.build).

torch's attention kernel rounds a query's result differently with the call's shape, so exact reuse
runs it over whole 512-key blocks under an explicit mask (engine.prefill_shapes): a 1,500-token
prompt computes every score of its 1,500 x 1,536 square, masked half included. The native kernel
walks each query row's keys in 64-key blocks at fixed absolute positions, up to its own position
only, with AVX512-BF16 dot products and a float32 online softmax. A row's result depends on its
query, its position and the keys and values at positions up to it alone, so a prompt computed whole
or split anywhere, with any thread count, gives every row the same bits, and it reads half the
scores. Its sums run in another order than torch's, so its results are close to SDPA's, not equal
(tests/engine/native/test_attention.py measures both).

It can run where the native decode step's bfloat16 CPU conditions hold and the compute dtype and
the KV store are bfloat16 (:meth:`NativeAttention.of` returns None elsewhere). A runner prefers it
(:func:`preferred`) except on CPUs with AMX, where torch's kernel multiplies in AMX tiles and the
two were not measured against each other: there torch's kernel runs.

Example:
    >>> attn = NativeAttention.of(torch.bfloat16, head_dim=64)             # doctest: +SKIP
    >>> out = attn(q, k_store[layer, 0], v_store[layer, 0], positions, scale)  # [T, H * D]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.isa import cpu_flags
from engine.native.build import NativeBuildError, native_module
from engine.native.decode import unavailable_reason

log = logging.getLogger(__name__)

HEAD_DIMS = (64, 128)  # what the kernel is compiled for


class NativeAttention:
    """Causal attention of query rows at explicit ascending positions over one layer's KV store.

    Example:
        >>> attn = NativeAttention.of(torch.bfloat16, head_dim=64)        # doctest: +SKIP
        >>> attn(q, keys, values, torch.arange(past, past + len(q)), 0.125).shape  # doctest: +SKIP
        torch.Size([T, H * D])
    """

    def __init__(self, module: Any) -> None:
        self._module = module

    @classmethod
    def of(cls, dtype: torch.dtype, head_dim: int) -> NativeAttention | None:
        """The kernel for ``dtype`` and ``head_dim`` on this machine, or None where it cannot run."""
        if dtype != torch.bfloat16 or head_dim not in HEAD_DIMS:
            return None
        if unavailable_reason(dtype, True, True) is not None:
            return None
        try:
            return cls(native_module())
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
        out: torch.Tensor = self._module.attend_rows(q.contiguous(), keys, values, positions, scale)
        return out


def preferred(dtype: torch.dtype, head_dim: int) -> NativeAttention | None:
    """The kernel a runner uses by default: :meth:`NativeAttention.of`, except on CPUs with AMX."""
    if "amx_bf16" in cpu_flags():
        return None
    return NativeAttention.of(dtype, head_dim)
