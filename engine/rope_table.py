"""RoPE cos/sin looked up per position instead of recomputed on every forward call.

The model's rotary module computes each position's cos/sin elementwise from that position alone
(``position * inv_freq``, then cos and sin), so a table made once holds the same bits the module
returns for any call; a lookup is two small gathers where the module runs about fifteen operations,
which a decode step of one token pays in every forward. Rotary types that rescale with the sequence
length (``dynamic``, ``longrope``) are computed by the module on every call instead.

Example:
    >>> rope = RopeTable(model.model.rotary_emb, model.model.embed_tokens.weight)  # doctest: +SKIP
    >>> cos, sin = rope(torch.tensor([0, 5, 9]))                                   # doctest: +SKIP
    >>> cos.shape                                                                  # doctest: +SKIP
    torch.Size([3, 1, 64])
"""

from __future__ import annotations

from typing import Any

import torch

_FIRST_ROWS = 4096  # positions in the first table; it doubles when a longer context needs more


class RopeTable:
    """cos/sin ``[T, 1, D]`` (broadcasting over heads) for positions ``[T]``, in the dtype of ``like``."""

    def __init__(self, rotary: Any, like: torch.Tensor) -> None:
        self.rotary = rotary
        self.like = like[:1]
        rope_type = str(getattr(rotary, "rope_type", "default"))
        self.tabled = "dynamic" not in rope_type and "longrope" not in rope_type
        self.cos: torch.Tensor | None = None  # [N, 1, D]
        self.sin: torch.Tensor | None = None

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.tabled:
            return self._compute(positions)
        needed = int(positions.max()) + 1 if positions.numel() else 1
        if self.cos is None or self.cos.shape[0] < needed:
            rows = max(_FIRST_ROWS, 2 * (0 if self.cos is None else self.cos.shape[0]), needed)
            with torch.inference_mode():
                self.cos, self.sin = self._compute(torch.arange(rows, device=positions.device))
        assert self.sin is not None
        return self.cos[positions], self.sin[positions]

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary(self.like, positions.unsqueeze(0))
        return cos[0].unsqueeze(1), sin[0].unsqueeze(1)
