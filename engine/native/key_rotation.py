"""A reused chunk's keys moved to a new position in place, in one native call
(``key_rotation.cpp``, built with the decode step: engine.native.build).

The torch form, ``engine.chunks.stitch.rotate_keys``, is seven operations over a run of the KV store;
each is a pass, and in a server a trip through the GIL and a wake-up of the thread pool (a
stitched prompt moves every reused chunk). The native call gives its bits (float32 products and sum,
no fused multiply-add, then the store's dtype) for keys stored in bfloat16 or float32, on any CPU
with AVX2 and FMA; elsewhere the torch form runs.

Example:
    >>> rotate = native_rotation()                                   # doctest: +SKIP
    >>> rotate is None or rotate(keys, cos, sin) is None             # doctest: +SKIP
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from engine.native.decode import avx2_function

Rotate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
DTYPES = (torch.bfloat16, torch.float32)  # what the kernel stores


@functools.cache
def native_rotation() -> Rotate | None:
    """``rotate(keys [L, H, N, D], cos [D], sin [D])`` in place where it runs here (AVX2 and FMA, not
    narrowed away), else None."""
    rotate: Rotate | None = avx2_function("rotate_keys_")
    return rotate
