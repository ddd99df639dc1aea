"""A prefill's Linears in one native call each (bfloat16: ``linear_tiles.cpp``, float32:
``linear_tiles_f32.cpp``, built with the decode step: engine.native.build), over weights packed once
in tiles of 16 output columns.

Exact reuse needs a row's result to depend on that row alone. oneDNN's and MKL's results depend on
the call's shape, so torch's Linears run a prefill as calibrated row tiles (engine.row_tiles): a
one-token prefill computes a whole tile of 16 rows, and small tiles run at a fraction of large ones'
rate. The native kernels sum each output in one register lane over the inputs in order (``tiles.h``;
in float32 one chain of fused multiply-adds), whatever the rows beside it, so they need no tiles: a
prompt prefilled whole or split anywhere gives every row the same bits, and one new token computes
one row, not a tile (how they compare with torch's tiles: docs/benchmarks/native/README.md). Their
sums run in another order than the libraries', so results are close to those, not equal.

The decode step reads the same packed tensors (engine.native.decode), so the weights are held once.
bfloat16: AVX512-BF16 dot products where the native decode step's bfloat16 CPU conditions hold,
else each weight pair widened to float32 on AVX2 + FMA (where oneDNN would emulate bfloat16 at an
eighth of float32's rate); a runner prefers it (:func:`preferred`) except on CPUs with AMX, where
oneDNN multiplies in AMX tiles. float32: AVX2 and FMA, or AVX-512 where the process may use it (the
same bits at either width).

On CPUs with AMX the same packing also multiplies in AMX tiles (:meth:`TiledLinear.amx`,
``linear_amx.cpp``): each output is then the sum oneDNN's AMX kernel computes, to the bit, at any row
count, so a runner whose prefill Linears are oneDNN's sends it the calls where it is faster
(engine.packed_linear) without changing a row.

Example:
    >>> w = TiledLinear.of(torch.randn(960, 576).bfloat16())            # doctest: +SKIP
    >>> w(torch.randn(3, 576).bfloat16()).shape                         # doctest: +SKIP
    torch.Size([3, 960])
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from engine.isa import amx_bf16_usable, cpu_flags
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


def pack_float32_tiles(weight: torch.Tensor) -> torch.Tensor:
    """A float32 Linear weight ``[n, k]`` as the float32 kernel reads it, ``[n / 16, k, 16]``: tile ``t``,
    input ``p`` holds columns ``16 t .. 16 t + 15``'s weights for that input side by side.

    Example:
        >>> pack_float32_tiles(torch.zeros(32, 6)).shape
        torch.Size([2, 6, 16])
    """
    n, k = weight.shape
    if n % TILE_COLUMNS:
        raise NativeBuildError(f"the native kernels need weights of {TILE_COLUMNS}n rows, got {n} x {k}")
    return weight.detach().reshape(n // TILE_COLUMNS, TILE_COLUMNS, k).transpose(1, 2).contiguous()


def wide_float32() -> bool:
    """Whether the float32 kernel runs AVX-512 here: the CPU has it and ATEN_CPU_CAPABILITY does not
    narrow the process below it (the bits are the same either way; only the speed differs)."""
    narrowed = os.environ.get("ATEN_CPU_CAPABILITY", "") in ("avx2", "default")
    return "avx512f" in cpu_flags() and not narrowed


def wide_bfloat16() -> bool:
    """Whether the bfloat16 kernel runs AVX512-BF16 dot products here (where the native bfloat16 decode
    step's CPU conditions hold); else it widens the pairs to float32 on AVX2 + FMA."""
    from engine.native.decode import avx512_bf16_reason  # decode imports this module's packing

    return avx512_bf16_reason() is None


class TiledLinear:
    """A bfloat16 or float32 Linear weight ``[out, in]`` packed in column tiles. ``x [M, in] -> [M,
    out]``; row i of the result depends on ``x[i]`` alone.

    Example:
        >>> w = TiledLinear.of(torch.randn(960, 576).bfloat16())        # doctest: +SKIP
        >>> w.shape, w(torch.randn(2, 576).bfloat16()).dtype           # doctest: +SKIP
        ((960, 576), torch.bfloat16)
    """

    __slots__ = ("_module", "_wide", "dtype", "shape", "tiles")

    def __init__(self, tiles: torch.Tensor, shape: tuple[int, int], module: object) -> None:
        self.tiles = tiles
        self.shape = shape
        self.dtype = tiles.dtype
        self._module = module
        self._wide = wide_float32() if tiles.dtype == torch.float32 else wide_bfloat16()

    @classmethod
    def of(cls, weight: torch.Tensor) -> TiledLinear:
        """``weight`` (bfloat16 or float32 ``[n, k]``, n a multiple of 16) packed, once per tensor;
        raises NativeBuildError."""
        if weight.dtype not in (torch.bfloat16, torch.float32):
            raise NativeBuildError(f"the native Linear multiplies bfloat16 or float32, got {weight.dtype}")
        single = weight.dtype == torch.float32
        tiles = _tiles.get(weight)
        if tiles is None:
            tiles = _tiles[weight] = (pack_float32_tiles if single else pack_column_tiles)(weight)
        return cls(tiles, (int(weight.shape[0]), int(weight.shape[1])), native_module())

    @property
    def nbytes(self) -> int:
        return self.tiles.numel() * self.tiles.element_size()

    def __call__(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x @ w.T``, then ``+ bias``: in bfloat16 the sums rounded, then the bias added and rounded, as
        torch's bfloat16 Linear and bias add; then ``residual + `` that, as torch's add (in the
        kernel's epilogue where it runs AVX512-BF16, the same bits)."""
        bias = x.new_empty(0) if bias is None else bias
        if residual is not None and not self._fuses:
            return residual + self._call(x, bias, False)
        return self._call(x, bias, False, residual)

    def amx(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x @ w.T`` (bfloat16) in AMX tiles, the bits of oneDNN's AMX Linear at any row count, then
        ``+ bias`` and ``residual +`` as torch's adds (where :func:`amx_available`)."""
        bias = x.new_empty(0) if bias is None else bias
        if residual is None:
            out: torch.Tensor = self._module.linear_amx_plain(x.contiguous(), self.tiles, bias)  # type: ignore[attr-defined]
        else:
            out = self._module.linear_amx(x.contiguous(), self.tiles, bias, residual.contiguous())  # type: ignore[attr-defined]
        return out

    def sums(self, x: torch.Tensor) -> torch.Tensor:
        """The float32 sums ``x @ w.T``, unrounded (logits: bfloat16 would blur near-ties)."""
        return self._call(x, x.new_empty(0), True)

    def glu(self, x: torch.Tensor, silu_mul: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``silu(gate) * up`` of a gate/up weight (the gate's rows first): in one native pass where the
        kernel runs AVX512-BF16 (the bits of this Linear followed by engine.native.rows' SiLU * value),
        else this Linear, then ``silu_mul``."""
        if self._fuses:
            out: torch.Tensor = self._module.linear_tiles_glu(x.contiguous(), self.tiles)  # type: ignore[attr-defined]
            return out
        return silu_mul(self(x))

    @property
    def _fuses(self) -> bool:
        # the epilogues (residual add, SiLU * up) live in the AVX512-BF16 kernel
        return self._wide and self.dtype == torch.bfloat16

    def _call(
        self, x: torch.Tensor, bias: torch.Tensor, sums: bool, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        out: torch.Tensor
        if self.dtype == torch.float32:  # the sums are the result: nothing to round
            out = self._module.linear_tiles_f32(x.contiguous(), self.tiles, bias, self._wide)  # type: ignore[attr-defined]
        elif residual is not None:  # in the epilogue: _fuses
            out = self._module.linear_tiles_add(x.contiguous(), self.tiles, bias, residual.contiguous())  # type: ignore[attr-defined]
        else:
            out = self._module.linear_tiles(x.contiguous(), self.tiles, bias, sums, self._wide)  # type: ignore[attr-defined]
        return out


def available(dtype: torch.dtype) -> bool:
    """Whether :class:`TiledLinear` can multiply for a runner computing in ``dtype`` on this machine:
    bfloat16 or float32, where the native float32 decode step's CPU conditions hold (AVX2 and FMA;
    bfloat16 also where AVX512-BF16 runs)."""
    from engine.native.decode import unavailable_reason  # decode imports this module's packing

    if dtype == torch.bfloat16 and wide_bfloat16():
        return True
    return dtype in (torch.bfloat16, torch.float32) and unavailable_reason(torch.float32, True, True) is None


@functools.cache
def amx_available() -> bool:
    """Whether :meth:`TiledLinear.amx` runs here: a CPU with AMX-BF16 that this process may use
    (engine.isa.amx_bf16_usable), and the kernel built and let use AMX's tile state."""
    if not amx_bf16_usable():
        return False
    try:
        return bool(native_module().amx_ready())
    except NativeBuildError:
        return False


def amx_fits(weight: torch.Tensor) -> bool:
    """Whether :meth:`TiledLinear.amx` can multiply by ``weight`` ``[n, k]``: bfloat16, n a multiple of
    16 and k of 32 (one AMX dot product's depth)."""
    n, k = weight.shape
    return weight.dtype == torch.bfloat16 and n % TILE_COLUMNS == 0 and k % 32 == 0 and amx_available()


def preferred(dtype: torch.dtype) -> bool:
    """Whether a runner computing in ``dtype`` multiplies with :class:`TiledLinear` by default: where
    it is :func:`available`, except bfloat16 where AMX runs (float32 has no AMX kernel to lose)."""
    return available(dtype) and (dtype == torch.float32 or not amx_bf16_usable())
