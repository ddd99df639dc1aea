"""Linear weights prepacked for decode: a few rows times a weight streamed from memory once.

``F.linear`` on a bfloat16 weight hands oneDNN a plain ``[out, in]`` matrix, which oneDNN reorders
into its blocked layout on every call: for a decode step's one to eight rows that reorder costs
more than the product itself. :class:`PackedLinear` reorders once, at load, and multiplies with
oneDNN's kernel for the packed layout (the same kernel and sums as ``F.linear``: on every probe the
results are equal, bit for bit). float32 weights stay plain (MKL's GEMV reads them as they are), as
do machines without oneDNN's bfloat16 support.

Example:
    >>> w = torch.randn(960, 576).bfloat16()
    >>> packed = PackedLinear.of(w)
    >>> x = torch.randn(2, 576).bfloat16()
    >>> torch.equal(packed(x), torch.nn.functional.linear(x, w))
    True
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

_ROWS_HINT = 1  # the batch size oneDNN tunes the packed layout for: decode's common case
# packed copies per weight tensor: runners over one model (engines in one process) share them
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()


@functools.cache
def packing_supported(dtype: torch.dtype) -> bool:
    """Whether weights of ``dtype`` are worth packing here (bfloat16 on a oneDNN build that has it)."""
    if dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and bool(ops._is_mkldnn_bf16_supported())


class PackedLinear:
    """``x [M, in] -> [M, out]`` with a weight packed once (or the plain weight where packing does not
    apply); the bias, if any, is added afterwards, elementwise, as the prefill's tiles add it."""

    __slots__ = ("bias", "packed", "weight")

    def __init__(self, weight: torch.Tensor, packed: torch.Tensor | None, bias: torch.Tensor | None) -> None:
        self.weight = weight  # [out, in], kept: the packed copy is opaque
        self.packed = packed
        self.bias = bias

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
        packed = None
        if packing_supported(weight.dtype):
            packed = _packed.get(weight)
            if packed is None:
                with torch.inference_mode():
                    packed = _packed[weight] = torch.ops.mkldnn._reorder_linear_weight(
                        weight.detach(), _ROWS_HINT
                    )
        return cls(weight, packed, bias)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed copy (0 when the plain weight is used)."""
        p = self.packed
        return 0 if p is None else p.numel() * p.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            out = F.linear(x, self.weight)
        else:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return out if self.bias is None else out + self.bias
