"""A decode step in one native call: every layer of a bfloat16 or float32 Llama-family model for B
new tokens.

The Python layer loop (engine/fused.py) runs on the order of a hundred torch operations per layer,
and oneDNN's bfloat16 kernels for a decode step's few rows do not stream the weights at the
machine's read bandwidth, so decode pays per-call overhead rather than bytes (measured:
docs/benchmarks/native/README.md). The native step (``decode_step.cpp``, compiled once per
machine: engine.native.build) runs the same layers in one call: AVX512-BF16 dot products over the
weights packed once in tiles of 16 output columns (engine.native.linear: each instruction adds into
16 columns' sums, so several rows share one pass over the weights), RMSNorm, RoPE, SiLU and the
residual adds fused around them, attention per KV group over the KV buffer in place, on a thread
team of its own; on CPUs without AVX512-BF16 (``decode_avx2.h``) the same layers run on AVX2 + FMA,
each bfloat16 pair widened to float32. It rounds to bfloat16 wherever the Python loop does and returns the lm_head's
float32 sums; its attention sums run in another order, so its results are close to the loop's, not
equal (tests/engine/native/test_decode.py checks greedy choices and the distance to float32). What
it guarantees beyond that: a row's result depends on its own token and KV alone, never on its batch
mates or the thread count.

In float32 (``decode_step_f32.cpp``, AVX2 and FMA: what ``dtype="auto"`` computes in on CPUs
without bfloat16 matmuls, such as AMD EPYC Zen 2/3) the same layers run unrounded, with the same
guarantees, over the float32 prefill's packed tiles (one copy of the weights; a row's Linear sums
are the prefill's bits). A step runs where the CPU has the instructions of one of the compute
dtype's steps (:data:`STEPS`, the first that can run), the KV format stores the compute dtype and decode is not
``batch_invariant`` (which runs a prefill's shapes instead); elsewhere :func:`unavailable_reason`
says why and the Python loop runs. int8 weights run engine.native.int8's kernels (engine.quant's
int8_linear bits) inside a step: :data:`INT8` (bfloat16 layers; AVX512-VNNI and AVX512-BF16) or
:data:`INT8_F32` (float32 layers on AVX2 + FMA, wherever the int8 kernels run: int8_reason).

Example:
    >>> step = NativeDecode.of(layers, final_norm, lm_head, (9, 3, 64), eps, scale)  # doctest: +SKIP
    >>> logits = step(x, cos, sin, buffers, pasts)  # [B, vocab] float32          # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.isa import cpu_flags
from engine.kv.state import KVBuffer
from engine.llama_weights import LlamaLayer
from engine.native.build import NativeBuildError, native_module
from engine.native.int8 import Int8Tiled, int8_reason, int8_tiles
from engine.native.linear import TiledLinear, wide_float32
from engine.quant.linear import Int8Weight

NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16")  # the AVX512-BF16 kernels
AVX2_FLAGS = ("avx2", "fma")
NARROW_CAPABILITIES = ("default", "avx2")  # ATEN_CPU_CAPABILITY values that emulate a CPU without AVX-512


@dataclass(frozen=True)
class Step:
    """A native decode step: its class, the CPU flags it needs and the ATEN_CPU_CAPABILITY values
    that rule it out (a process narrowed below its instructions)."""

    native_class: str
    flags: tuple[str, ...]
    narrowing: tuple[str, ...]

    def unavailable_reason(self) -> str | None:
        missing = [flag for flag in self.flags if flag not in cpu_flags()]
        if missing:
            return f"the CPU lacks {', '.join(missing)}"
        capability = os.environ.get("ATEN_CPU_CAPABILITY", "")
        if capability in self.narrowing:
            return f"ATEN_CPU_CAPABILITY={capability} narrows this process to a CPU without {self.flags[0].upper()}"
        return None


AVX512_BF16 = Step("DecodeModel", NEEDED_FLAGS, NARROW_CAPABILITIES)
# int8 weights: AVX512-VNNI's integer dot products around the AVX512-BF16 step's bfloat16 layers
INT8 = Step("DecodeModelInt8", (*NEEDED_FLAGS, "avx512_vnni"), NARROW_CAPABILITIES)
# int8 weights around the float32 step's layers: the int8 kernel of the weights' activation levels
INT8_F32 = Step("DecodeModelF32Int8", AVX2_FLAGS, ("default",))
# per compute dtype, its steps in order of preference: the first that can run here runs
STEPS: dict[torch.dtype, tuple[Step, ...]] = {
    torch.bfloat16: (AVX512_BF16, Step("DecodeModelAvx2", AVX2_FLAGS, ("default",))),
    torch.float32: (Step("DecodeModelF32", AVX2_FLAGS, ("default",)),),
}


def avx512_bf16_reason() -> str | None:
    """Why the AVX512-BF16 kernels (the bfloat16 prefill attention and row passes, the wide Linear)
    cannot run in this process (None: they can)."""
    return AVX512_BF16.unavailable_reason()


def unavailable_reason(dtype: torch.dtype, float_weights: bool, kv_identity: bool) -> str | None:
    """Why no native step can run for these settings on this machine (None: one can)."""
    if dtype not in STEPS:
        return f"the compute dtype is {str(dtype).removeprefix('torch.')} (the native step is bfloat16 or float32)"
    if not kv_identity:
        return "the KV format rounds keys and values (the native step stores the compute dtype)"
    if not float_weights:
        if dtype == torch.bfloat16:
            return INT8.unavailable_reason()
        return INT8_F32.unavailable_reason() or int8_reason()
    reasons = [step.unavailable_reason() for step in STEPS[dtype]]
    return None if None in reasons else reasons[-1]  # the last step needs the least


def avx2_function(name: str) -> Any | None:
    """The compiled extension's function ``name``, for kernels that need AVX2 and FMA alone (the
    sampler's draw, the key rotation), where they run here (not narrowed away), else None."""
    if unavailable_reason(torch.float32, True, True) is not None:  # the float32 step needs as much
        return None
    try:
        return getattr(native_module(), name)
    except NativeBuildError:
        return None


def step_for(dtype: torch.dtype, float_weights: bool = True) -> Step:
    """The step that runs ``dtype`` here (raises NativeBuildError where none can)."""
    int8_steps = (INT8,) if dtype == torch.bfloat16 else (INT8_F32,)
    for step in STEPS.get(dtype, ()) if float_weights else int8_steps:
        if step.unavailable_reason() is None:
            return step
    raise NativeBuildError(str(unavailable_reason(dtype, float_weights, True)))


# (the step's float32 logits [B, vocab], its hidden states [B, hidden]) -> the logits to sample from
Head = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
MATMULS = (2, 4, 6, 7)  # a layer row's wqkv, wo, wgu, wdown


def _held(
    weight: torch.Tensor | TiledLinear | Int8Weight | Int8Tiled, matmul: bool
) -> torch.Tensor | list[torch.Tensor]:
    if isinstance(weight, Int8Tiled):  # the prefill's packed copy, held once, read by both
        return weight.parts
    if isinstance(weight, Int8Weight):
        return int8_tiles(weight)
    if isinstance(weight, TiledLinear):  # the prefill's packed copy, held once, read by both
        return weight.tiles
    if not matmul:
        return weight.detach().contiguous()
    # packed once per tensor (engine.native.linear's cache): the AMX twin of a oneDNN-packed Linear reads them too
    return TiledLinear.of(weight).tiles


class NativeDecode:
    """The native decode step over one model's weights (the packed tiles a prefill reads, held, not copied)."""

    def __init__(self, model: Any, held: list[torch.Tensor], head: Head | None = None) -> None:
        self._model = model
        self.held = held  # what the native object references: weight_bytes counts it
        self._head = head  # int8: rescores the step's best logits from its hidden states

    @classmethod
    def of(
        cls,
        layers: Sequence[LlamaLayer],
        final_norm: torch.Tensor,
        lm_head: object,
        geometry: tuple[int, int, int],
        eps: float,
        scale: float,
        head: Head | None = None,
    ) -> NativeDecode:
        """Build over ``layers`` (plain tensors or :class:`TiledLinear`, before oneDNN packing, or
        int8 matrices); raises NativeBuildError. int8 layers need ``head``, which finishes the step's
        logits from its hidden states (int8's rescoring)."""
        dtype = final_norm.dtype
        int8 = isinstance(layers[0].wqkv, (Int8Weight, Int8Tiled))
        if int8 != (head is not None):
            raise NativeBuildError("int8 layers, and only they, take a Python head for their logits")
        native_class = step_for(dtype, float_weights=not int8).native_class  # one can run here
        kinds = (Int8Weight, Int8Tiled) if int8 else (torch.Tensor, TiledLinear)
        empty = torch.empty(0, dtype=dtype)
        tensors = []
        for layer in layers:
            row = [layer.in_norm, layer.post_norm, layer.wqkv, layer.bqkv, layer.wo, layer.bo]
            row += [layer.wgu, layer.wdown]
            plain = [empty if t is None else t for t in row]
            if not all(isinstance(t, kinds) for i, t in enumerate(plain) if i in MATMULS):
                raise NativeBuildError("the native step needs one weight format in every Linear")
            tensors.append([_held(t, i in MATMULS) for i, t in enumerate(plain)])  # type: ignore[arg-type]
        if isinstance(lm_head, kinds):
            lm_head = _held(lm_head, True)
        else:
            raise NativeBuildError("the native step needs an lm_head in its Linears' format")
        # the steps take each entry as a list of tensors
        tensors = [[t if isinstance(t, list) else [t] for t in row] for row in tensors]
        lm_head = lm_head if isinstance(lm_head, list) else [lm_head]
        heads, kv_heads, head_dim = geometry
        module = native_module()
        width = (wide_float32(),) if dtype == torch.float32 else ()  # the same bits at either width
        try:
            model = getattr(module, native_class)(
                tensors, final_norm.detach().contiguous(), lm_head,
                heads, kv_heads, head_dim, eps, scale, *width,
            )  # fmt: skip
        except RuntimeError as exc:  # a geometry the kernels do not cover
            raise NativeBuildError(str(exc)) from exc
        return cls(model, [*_flat(tensors), final_norm, *_flat([lm_head])], head)

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        buffers: Sequence[KVBuffer],
        pasts: Sequence[int],
    ) -> torch.Tensor:
        """Logits ``[B, vocab]`` (float32) of ``x [B, hidden]`` at positions ``pasts``, each row's K/V
        written into its buffer at its position; ``cos``/``sin`` ``[B, head_dim]``."""
        for buffer, past in zip(buffers, pasts):
            buffer.reserve(past + 1)
        stores = [b.stores() for b in buffers]
        args = (
            x,
            cos.contiguous(),
            sin.contiguous(),
            [k for k, _ in stores],
            [v for _, v in stores],
            list(pasts),
        )
        if self._head is None:
            logits: torch.Tensor = self._model.step(*args)
            return logits
        return self._head(*self._model.step_and_hidden(*args))


def _flat(items: Sequence[Any]) -> list[torch.Tensor]:
    """Every tensor in nested lists."""
    return [t for item in items for t in (_flat(item) if isinstance(item, list) else [item])]
