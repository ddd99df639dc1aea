"""A prefill's bfloat16 Linears in one native call each (``linear_tiles.cpp``, built with the decode
step: engine.native.build), over weights packed once in tiles of 16 output columns.

Exact reuse needs a row's result to depend on that row alone. oneDNN's result depends on the call's
shape, so the other Linears run a prefill as calibrated row tiles (engine.row_tiles): a one-token
prefill computes a whole tile of 16 rows, and oneDNN's small tiles run at a fraction of its large
ones' rate. The native kernel sums each output in one register lane over the inputs in order
(``tiles.h``), whatever the rows beside it, so it needs no tiles: a prompt prefilled whole or split
anywhere gives every row the same bits, and one new token computes one row, not a tile (how it
compares with oneDNN's tiles: docs/benchmarks/native/README.md). Its sums run in another order than
oneDNN's, so its results are close to those, not equal.

The decode step reads the same packed tensors (engine.native.decode), so the weights are held once.
It can run where the native decode step's bfloat16 CPU conditions hold; a runner prefers it
(:func:`preferred`) except on CPUs with AMX, where oneDNN multiplies in AMX tiles.

Example:
    >>> w = TiledLinear.of(torch.randn(960, 576).bfloat16())            # doctest: +SKIP
    >>> w(torch.randn(3, 576).bfloat16()).shape                         # doctest: +SKIP
    torch.Size([3, 960])
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from engine.isa import cpu_flags
from engine.native.build import NativeBuildError, native_module

TILE_COLUMNS = 16  # tiles.h's column tile
# packed copies per weight tensor: runners over one model (engines in one process) share them
_tiles: WeakIdKeyDictionary = WeakIdKeyDictionary()


def pack_column_tiles(weight: torch.Tensor) -> torch.Tensor:
    """A Linear weight ``[n, k]`` as the native kernels read it, ``[n / 16, k / 2, 16, 2]``: tile ``t``,
    pair ``p`` holds columns ``16 t .. 16 t + 15``'s inputs ``2 p, 2 p + 1`` side by side.

    Example:
        >>> pack_column_tiles(torch.zeros(32, 8)).shape
        torch.Size([2, 4, 16, 2])
    """
    n, k = weight.shape
    if n % TILE_COLUMNS or k % 2:
        raise NativeBuildError(f"the native kernels need weights of {TILE_COLUMNS}n x 2k, got {n} x {k}")
    return weight.detach().reshape(n // TILE_COLUMNS, TILE_COLUMNS, k // 2, 2).transpose(1, 2).contiguous()


class TiledLinear:
    """A bfloat16 Linear weight ``[out, in]`` packed in column tiles. ``x [M, in] -> [M, out]``; row i
    of the result depends on ``x[i]`` alone.

    Example:
        >>> w = TiledLinear.of(torch.randn(960, 576).bfloat16())        # doctest: +SKIP
        >>> w.shape, w(torch.randn(2, 576).bfloat16()).dtype           # doctest: +SKIP
        ((960, 576), torch.bfloat16)
    """

    __slots__ = ("_module", "dtype", "shape", "tiles")

    def __init__(self, tiles: torch.Tensor, shape: tuple[int, int], module: object) -> None:
        self.tiles = tiles
        self.shape = shape
        self.dtype = tiles.dtype
        self._module = module

    @classmethod
    def of(cls, weight: torch.Tensor) -> TiledLinear:
        """``weight`` (bfloat16 ``[n, k]``, n a multiple of 16) packed, once per tensor; raises
        NativeBuildError."""
        if weight.dtype != torch.bfloat16:
            raise NativeBuildError(f"the native Linear multiplies bfloat16, got {weight.dtype}")
        tiles = _tiles.get(weight)
        if tiles is None:
            tiles = _tiles[weight] = pack_column_tiles(weight)
        return cls(tiles, (int(weight.shape[0]), int(weight.shape[1])), native_module())

    @property
    def nbytes(self) -> int:
        return self.tiles.numel() * self.tiles.element_size()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``bf16(x @ w.T)``, then ``+ bias`` rounded: what torch's bfloat16 Linear and bias add give."""
        return self._call(x, x.new_empty(0) if bias is None else bias, False)

    def sums(self, x: torch.Tensor) -> torch.Tensor:
        """The float32 sums ``x @ w.T``, unrounded (logits: bfloat16 would blur near-ties)."""
        return self._call(x, x.new_empty(0), True)

    def _call(self, x: torch.Tensor, bias: torch.Tensor, sums: bool) -> torch.Tensor:
        kernel = self._module.linear_tiles  # type: ignore[attr-defined]
        out: torch.Tensor = kernel(x.contiguous(), self.tiles, bias, sums)
        return out


def available(dtype: torch.dtype) -> bool:
    """Whether :class:`TiledLinear` can multiply for a runner computing in ``dtype`` on this machine:
    bfloat16, where the native decode step's CPU conditions hold."""
    from engine.native.decode import unavailable_reason  # decode imports this module's packing

    return dtype == torch.bfloat16 and unavailable_reason(dtype, True, True) is None


def preferred(dtype: torch.dtype) -> bool:
    """Whether a runner computing in ``dtype`` multiplies with :class:`TiledLinear` by default: where
    it is :func:`available`, except on CPUs with AMX."""
    return "amx_bf16" not in cpu_flags() and available(dtype)
