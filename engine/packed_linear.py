"""Linear weights prepacked once, instead of on every call.

``F.linear`` on a bfloat16 weight hands oneDNN a plain ``[out, in]`` matrix, which oneDNN reorders
into its blocked layout on every call: for a decode step's one to eight rows, or a prefill tile of
16 or 32, that reorder costs as much as the product itself. :class:`PackedLinear` reorders once, at
load, and multiplies with oneDNN's kernel for the packed layout. A prefill runs it as calibrated row
tiles like any float matmul (engine.row_tiles), on a menu measured for this kernel
(:func:`packed_menu`), so reuse of cached KV stays exact. float32 weights stay plain (MKL's GEMM
reads them as they are), as do machines without oneDNN's bfloat16 support.

On CPUs with AMX, calls of up to ``AMX_ROWS`` rows run in the native AMX kernel instead
(engine.native.linear's :meth:`~engine.native.linear.TiledLinear.amx`, over the column tiles the
native decode step holds anyway): each row gets the bits of oneDNN's ``TILE``-row call whatever the
row count, without oneDNN's per-call overhead, so a warm request's few new tokens stream the weights
at the decode step's rate, and a stitched prefill's few hundred rows run faster than in oneDNN. The
kernel adds the bias and a residual in its epilogue, with the bits of torch's adds.

Example:
    >>> w = torch.randn(960, 576).bfloat16()
    >>> packed = PackedLinear.of(w)
    >>> x = torch.randn(2, 576).bfloat16()
    >>> torch.equal(packed(x), torch.nn.functional.linear(x, w)), packed.shape
    (True, (960, 576))
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from engine.native.linear import TiledLinear, amx_fits
from engine.row_tiles import TileMenu, cached_menu, calibrate, problem_rows, tiled_linear

AMX_ROWS = (
    384  # the most rows a call sends to the AMX kernel: past it oneDNN's is faster (docs/benchmarks/native)
)
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


def _pack(weight: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS_HINT)


class PackedLinear:
    """A float Linear weight ``[out, in]`` in the form its kernel multiplies: packed once where that
    pays (then the plain tensor is not referenced), else the plain tensor. ``x [M, in] -> [M, out]``."""

    __slots__ = ("amx", "dtype", "packed", "plain", "shape")

    def __init__(
        self, weight: torch.Tensor, packed: torch.Tensor | None, amx: TiledLinear | None = None
    ) -> None:
        self.shape = tuple(weight.shape)
        self.dtype = weight.dtype
        self.packed = packed
        self.plain = None if packed is not None else weight
        self.amx = amx  # the column tiles that small calls multiply in AMX tiles (None: oneDNN only)

    @classmethod
    def of(cls, weight: torch.Tensor) -> PackedLinear:
        packed = None
        if packing_supported(weight.dtype):
            packed = _packed.get(weight)
            if packed is None:
                packed = _packed[weight] = _pack(weight)
        return cls(
            weight, packed, TiledLinear.of(weight) if packed is not None and amx_fits(weight) else None
        )

    @property
    def nbytes(self) -> int:
        """Bytes held (the packed copy, or the plain weight; the AMX twin's tiles are the native decode
        step's, counted with its tensors: engine.llama_weights.weight_bytes)."""
        held = self.packed if self.packed is not None else self.plain
        assert held is not None
        return held.numel() * held.element_size()

    def __call__(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One call over all of ``x``'s rows (decode's few, a stitched prefill's; no row-exactness
        promised), then ``+ bias`` and ``residual +`` as torch's bfloat16 adds."""
        if self.amx is not None and x.shape[0] <= AMX_ROWS:
            return self.amx.amx(x, bias, residual)
        if self.packed is None:
            assert self.plain is not None
            out = F.linear(x, self.plain)
        else:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return _added(out, bias, residual)

    def tiled(
        self,
        x: torch.Tensor,
        menu: TileMenu,
        bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` as calls of ``menu``'s row counts (:func:`packed_menu`): row i depends on x[i] alone;
        the bias and ``residual`` added afterwards, elementwise (a call the AMX kernel takes needs no
        tiles: its rows get these bits at any count)."""
        if self.amx is not None and x.shape[0] <= AMX_ROWS:
            return self.amx.amx(x, bias, residual)
        return _added(tiled_linear(x, x.new_empty(0), menu, bias, matmul=self), None, residual)


def _added(out: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
    out = out if bias is None else out + bias
    return out if residual is None else residual + out


def packed_menu(in_features: int, out_features: int, dtype: torch.dtype) -> TileMenu:
    """The row-tile menu of the packed kernel for an ``[out, in]`` weight of this dtype on this machine
    (measured once and kept, like every menu: engine.row_tiles)."""
    key = ("packed_linear", in_features, out_features, dtype)
    return cached_menu(key, lambda: _calibrate(in_features, out_features, dtype))


def _calibrate(in_features: int, out_features: int, dtype: torch.dtype) -> TileMenu:
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=gen) / in_features**0.5).to(dtype)
    x = torch.randn(problem_rows(), in_features, generator=gen).to(dtype)
    linear = PackedLinear(weight, _pack(weight) if packing_supported(dtype) else None)
    with torch.inference_mode():
        return calibrate(lambda start, size: linear(x[start : start + size]))
