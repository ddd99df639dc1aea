"""The runner protocol: the forward passes the engine drives, and what each runner states it can do.

Two runners implement it: ``engine.fused.FusedLlamaRunner`` (Llama-family layers, batched decode, chunk
stitching, int8 weights) and ``engine.runner.ModelRunner`` (transformers' own forward, any causal LM).
The engine reads ``runner.capabilities``; it never checks a runner's class.

Example:
    >>> engine.runner.capabilities.batched_decode, engine.runner.capabilities.chunk_stitching  # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch

from engine.kv.state import KVBuffer

if TYPE_CHECKING:
    from engine.fused import FusedLlamaRunner

NO_STITCHING = "chunk stitching needs the fused Llama-family runner"


@dataclass(frozen=True)
class RunnerCapabilities:
    """What a runner can do beyond prefill and decode.

    ``batched_decode``: ``decode_batch`` runs its sequences as one forward (else one forward each).
    ``int8_weights``: it computes with int8 weights. ``stitch_blocker``: why it cannot run a stitched
    prefill for ``reuse="chunks"`` (None: it can, ``engine.chunks.stitch``).

    Example:
        >>> RunnerCapabilities().chunk_stitching
        False
    """

    batched_decode: bool = False
    int8_weights: bool = False
    stitch_blocker: str | None = NO_STITCHING

    @property
    def chunk_stitching(self) -> bool:
        return self.stitch_blocker is None


class Runner(Protocol):
    """The forward passes over per-request ``KVBuffer``s; logits are float32 ``[vocab]`` rows."""

    capabilities: RunnerCapabilities
    num_layers: int
    vocab_size: int
    max_context: int
    dtype: torch.dtype
    device: torch.device

    def new_buffer(self, capacity: int) -> KVBuffer: ...

    def prefill(self, token_ids: Sequence[int], buffer: KVBuffer) -> torch.Tensor: ...

    def decode_step(self, token_id: int, buffer: KVBuffer) -> torch.Tensor: ...

    def decode_batch(self, token_ids: Sequence[int], buffers: Sequence[KVBuffer]) -> list[torch.Tensor]: ...

    def weight_bytes(self) -> int: ...


def stitching_runner(runner: Runner) -> FusedLlamaRunner | None:
    """The runner as ``engine.chunks`` drives it, when it states ``chunk_stitching`` (None otherwise)."""
    return cast("FusedLlamaRunner", runner) if runner.capabilities.chunk_stitching else None
