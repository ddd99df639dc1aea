"""int8 weights in the form the native kernels multiply them: the digits of engine.quant's
per-channel int8 matrices packed in column tiles, read by a prefill's Linears (``linear_int8.cpp``)
and the decode step alike. The activation levels of the weights' backend pick the kernel: oneDNN's
127 AVX512-VNNI's (``int8_tiles.h``), fbgemm's 63 AVX2's (``int8_avx2.h``, whose 16-bit pair sums
hold 63 levels exactly and 127 would not).

The kernels compute engine.quant.linear.int8_linear's arithmetic: the same activation digits, exact
integer sums (the instructions multiply unsigned bytes, so a digit enters as itself plus a shift and
``shift * sum_k w[c, k]`` is subtracted after), the digits combined in float64 and scaled back in
float32 in the same order, so each row's outputs are int8_linear's bits.

Example:
    >>> from engine.quant.linear import quantize_weight
    >>> parts = int8_tiles(quantize_weight(torch.randn(32, 16)))  # doctest: +SKIP
    >>> [tuple(p.shape) for p in parts]                             # doctest: +SKIP
    [(2, 4, 16, 4), (32,), (32,), (1,)]

:class:`Int8Tiled` holds a matrix in that form alone, for the prefill's Linears and the decode step
(the oneDNN copy is then dropped), where :func:`int8_reason` says the kernels run.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch

from engine.native.build import NativeBuildError, native_module
from engine.quant.linear import FBGEMM_LEVELS, ONEDNN_LEVELS, Int8Weight, int8_backend, int8_supported

TILE_COLUMNS = 16
UNSIGNED_SHIFT = 128  # an activation digit a in [-127, 127] enters the unsigned-byte product as a + 128

# One tiled form per int8 matrix object, by identity: the runners over one model share its int8 copy
# (engine.quant.model) and only read the tiles, so each would otherwise pack the same digits again.
_tiled: dict[int, Int8Tiled] = {}
_tiled_lock = threading.Lock()


def pack_int8_digits(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 ``[n, k]`` -> (``[n / 16, k / 4, 16, 4]``: tile ``t``, quad ``p`` holds columns
    ``16 t .. 16 t + 15``'s inputs ``4 p .. 4 p + 3`` side by side; int32 ``128 * row sums [n]``)."""
    n, k = q.shape
    if n % TILE_COLUMNS or k % 4:
        raise NativeBuildError(f"the native int8 kernels need weights of {TILE_COLUMNS}n x 4k, got {n} x {k}")
    packed = q.reshape(n // TILE_COLUMNS, TILE_COLUMNS, k // 4, 4).transpose(1, 2).contiguous()
    offset = (q.to(torch.int32).sum(dim=1) * UNSIGNED_SHIFT).to(torch.int32)
    return packed, offset


def int8_tiles(weight: Int8Weight) -> list[torch.Tensor]:
    """The tensors the native step takes for one int8 matrix: packed digits, offsets, scales, the
    activations' levels, and with a residual digit its packed digits and offsets."""
    n = weight.out_features
    levels = ONEDNN_LEVELS if weight.backend == "onednn" else FBGEMM_LEVELS
    parts = [*pack_int8_digits(weight.q[:n]), weight.scales.contiguous(), torch.tensor([float(levels)])]
    if weight.residual:
        parts += pack_int8_digits(weight.q[n:])
    return parts


@dataclass(frozen=True)
class Int8Tiled:
    """An int8 matrix held only in the native kernels' form: a prefill's Linear (``linear_int8.cpp``)
    and the decode step read the same tensors; ``self(x)`` gives int8_linear's bits for every row.

    Example:
        >>> w = Int8Tiled.of(quantize_weight(torch.randn(32, 16)))  # doctest: +SKIP
        >>> w(torch.randn(3, 16)).shape                              # doctest: +SKIP
        torch.Size([3, 32])
    """

    parts: list[torch.Tensor]
    out_features: int
    in_features: int
    residual: bool

    @classmethod
    def of(cls, weight: Int8Weight) -> Int8Tiled:
        """``weight`` in tiles, packed once per matrix object while it lives."""
        with _tiled_lock:
            held = _tiled.get(id(weight))
            if held is None:
                held = _tiled[id(weight)] = cls(
                    int8_tiles(weight), weight.out_features, weight.in_features, weight.residual
                )
                weakref.finalize(weight, _tiled.pop, id(weight), None)
            return held

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        out: torch.Tensor = native_module().int8_linear_sums(rows, self.parts).to(x.dtype)
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], self.out_features)


def int8_reason() -> str | None:
    """Why the native int8 kernels cannot run in this process (None: they can)."""
    from engine.native.decode import INT8, INT8_F32  # decode imports this module's packing

    backend = int8_backend()
    if backend == "onednn":  # 127 levels: the VNNI kernel
        return INT8.unavailable_reason()
    if backend == "fbgemm":  # 63 levels: the AVX2 kernel, which the float32 step's flags cover
        return INT8_F32.unavailable_reason()
    return int8_supported()
