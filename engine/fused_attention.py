"""Where a fused forward's tokens write their K/V and how their queries attend, one class per kind of
call; the runner's one layer loop (``FusedLlamaRunner.run_layers``) takes any of them.

  * :class:`PrefillAttention`: tokens at positions ``past .. past + s`` of one buffer, attending as
    engine.prefill_shapes lays out (query tiles over full, masked key blocks), or each row over its
    own keys in the native kernel (engine.native.attention) where it runs: exact reuse either way;
  * :class:`PositionsAttention`: tokens at explicit ascending positions of one buffer (a stitched
    prefill), each attending causally over everything the buffer holds before it (an explicit mask,
    or the native kernel where it runs);
  * :class:`DecodeAttention`: one new token for each of B buffers, each attending over its own KV
    (with ``exact``: a prefill's shapes, so its KV is the bits a prefill would write).

Example:
    >>> plan = PrefillAttention(runner, buffer, past=0, tokens=len(ids))   # doctest: +SKIP
    >>> x = runner.run_layers(x, cos, sin, plan)                           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from engine.kv.state import KVBuffer
from engine.native.attention import NativeAttention
from engine.prefill_shapes import QUERY_ROWS, aligned_keys, key_block_spans, prefill_mask
from engine.row_tiles import TILE, TileMenu, round_up

# one attention call of a prefill: first query row, real rows, tile rows, keys read, mask [tile, keys]
_Call = tuple[int, int, int, int, torch.Tensor]


class Attention(Protocol):
    """How one forward call's tokens meet the KV cache, layer by layer."""

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the call's keys/values ``[T, KVH, D]`` (already in the cache's format) of ``layer``."""

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention output ``[T, H * D]`` of the call's queries ``[T, H, D]`` at ``layer``."""


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    past: int,
    scale: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: ``[R, H, D]``, row i at position past + i; keys/values ``[1, KVH, K, D]`` -> ``[R, H * D]``.
    Keys past the last query's position must be finite: the causal mask hides them."""
    r = q.shape[0]
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, R, D]
    if r == 1 and mask is None and keys.shape[2] == past + 1:  # one query over exactly its keys
        out = F.scaled_dot_product_attention(qh, keys, values, scale=scale, enable_gqa=True)
    else:  # causal with an offset: query i sees keys 0..past + i
        if mask is None:
            mask = prefill_mask(r, past, keys.shape[2], q.device)
        out = F.scaled_dot_product_attention(qh, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(r, -1)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as SDPA converts it on every call (0 where visible, -inf elsewhere, in the queries'
    dtype): the same bits, converted once per forward instead of once per layer."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
        ~visible, float("-inf")
    )


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``rows`` (``x`` itself when it has that many)."""
    if x.shape[0] >= rows:
        return x
    return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])


def clear_key_padding(buffer: KVBuffer, start: int, end: int) -> None:
    """Zero every layer's keys/values [start, end): attention reads them under the mask, so they
    must be finite, and recycled storage may hold anything."""
    k_store, v_store = buffer.stores()
    k_store[:, :, :, start:end] = 0
    v_store[:, :, :, start:end] = 0


class PrefillAttention:
    """``tokens`` new tokens after the ``past`` a buffer holds (rows past ``tokens`` are matmul
    padding: they write nothing and attend to nothing)."""

    def __init__(
        self,
        buffer: KVBuffer,
        past: int,
        tokens: int,
        tiles: TileMenu | None,
        scale: float,
        native: NativeAttention | None = None,
    ) -> None:
        self.past, self.tokens, self.scale = past, tokens, scale
        self.keys_end = aligned_keys(past + tokens)
        buffer.reserve(self.keys_end)
        self.k_store, self.v_store = buffer.stores()
        # the native kernel reads each row's own keys only: no padding, masks or tiles
        self.native = native if native is not None and self.k_store.dtype == native.dtype else None
        if self.native is not None:
            self.positions = torch.arange(past, past + tokens)
            self.calls: list[_Call] = []
            return
        clear_key_padding(buffer, past + tokens, self.keys_end)
        self.calls = self._calls(tiles, buffer.k_store.device if buffer.k_store is not None else "cpu")

    def _calls(self, tiles: TileMenu | None, device: object) -> list[_Call]:
        """Per key block the queries' positions fall in, query tiles from the attention menu (None:
        one call per key block), each under an explicit mask (see engine.prefill_shapes)."""
        calls = []
        for a, b, keys in key_block_spans(self.past, self.tokens):
            start = a
            for size in tiles.plan(b - a) if tiles is not None else (round_up(b - a, TILE),):
                real = min(size, b - start)
                mask = additive_mask(prefill_mask(size, self.past + start, keys, device), self.k_store.dtype)
                calls.append((start, real, size, keys, mask))
                start += real
        return calls

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        p, s = self.past, self.tokens
        self.k_store[layer, 0, :, p : p + s] = k[:s].transpose(0, 1)
        self.v_store[layer, 0, :, p : p + s] = v[:s].transpose(0, 1)

    def attend_last(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """The output ``[1, H * D]`` of the call's last token alone (its query ``q [1, H, D]``), in the
        native kernel: a row's result there never depends on the rows beside it, so these are the
        bits :meth:`attend` gives that row."""
        assert self.native is not None, "one row alone is the native kernel's row"
        keys, values = self.k_store[layer, 0], self.v_store[layer, 0]
        return self.native(q, keys, values, self.positions[-1:], self.scale)

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            keys, values = self.k_store[layer, 0], self.v_store[layer, 0]
            out = self.native(q[: self.tokens], keys, values, self.positions, self.scale)
            return pad_rows(out, q.shape[0])
        keys = self.k_store[layer, :, :, : self.keys_end]
        values = self.v_store[layer, :, :, : self.keys_end]
        out = q.new_zeros(q.shape[0], q.shape[1] * q.shape[2])
        for start, real, size, n, mask in self.calls:
            rows = pad_rows(q[start : start + real], size)
            attn = attend(rows, keys[:, :, :n], values[:, :, :n], self.past + start, self.scale, mask)
            out[start : start + real] = attn[:real]
        return out


class PositionsAttention:
    """Tokens at explicit ascending ``positions`` of one buffer: each writes its K/V there and
    attends causally over the buffer's keys ``0 .. its position``."""

    def __init__(
        self, buffer: KVBuffer, positions: torch.Tensor, scale: float, native: NativeAttention | None = None
    ) -> None:
        self.positions, self.scale = positions, scale
        self.total = int(positions[-1]) + 1
        # which keys each row sees: SDPA's mask, and what the chunk selection's attention mass reads
        self.mask = torch.arange(self.total, device=positions.device)[None, :] <= positions[:, None]
        self.k_store, self.v_store = buffer.stores()
        self.native = native if native is not None and self.k_store.dtype == native.dtype else None
        self.native_positions = positions.to(torch.long).contiguous()

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_store[layer, 0][:, self.positions] = k.transpose(0, 1)
        self.v_store[layer, 0][:, self.positions] = v.transpose(0, 1)

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return self.native(
                q, self.k_store[layer, 0], self.v_store[layer, 0], self.native_positions, self.scale
            )
        keys = self.k_store[layer, :, :, : self.total]
        values = self.v_store[layer, :, :, : self.total]
        return attend(q, keys, values, 0, self.scale, self.mask)


class DecodeAttention:
    """Row j of the call is the next token of ``buffers[j]``; rows past the buffers are padding.

    ``exact``: each row attends as one query tile of a prefill (padded to ``QUERY_ROWS`` rows, over
    its buffer's keys rounded up to a full key block, masked), so its result and KV never depend on
    the batch; else one query over exactly its keys (the fastest call). With ``native`` (the prefill's
    native kernel, engine.native.attention) an exact row attends as a prefill's row does there: over
    its own keys, in that kernel, so its KV equals a prefill's.
    """

    def __init__(
        self, buffers: Sequence[KVBuffer], exact: bool, scale: float, native: NativeAttention | None = None
    ) -> None:
        self.scale, self.exact = scale, exact
        self.native = native if exact else None
        self.pasts = [b.length for b in buffers]
        self.ends = [aligned_keys(p + 1) if exact else p + 1 for p in self.pasts]  # keys each row reads
        for b, p, end in zip(buffers, self.pasts, self.ends):
            b.reserve(end)
            if exact:
                clear_key_padding(b, p + 1, end)
        self.stores = [(k[:, 0], v[:, 0]) for k, v in (b.stores() for b in buffers)]  # [L, KVH, cap, D]
        self.masks = [
            prefill_mask(QUERY_ROWS, p, end) if exact else None for p, end in zip(self.pasts, self.ends)
        ]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for j, (k_store, v_store) in enumerate(self.stores):
            p = self.pasts[j]
            k_store[layer, :, p] = k[j]
            v_store[layer, :, p] = v[j]

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        outs = []
        rows = QUERY_ROWS if self.exact else 1
        for j, (k_store, v_store) in enumerate(self.stores):
            if self.native is not None and k_store.dtype == self.native.dtype:
                at = torch.tensor([self.pasts[j]])
                outs.append(self.native(q[j : j + 1], k_store[layer], v_store[layer], at, self.scale))
                continue
            end = self.ends[j]
            keys, values = k_store[layer, :, :end].unsqueeze(0), v_store[layer, :, :end].unsqueeze(0)
            qj = pad_rows(q[j : j + 1], rows)  # [rows, H, D]
            outs.append(attend(qj, keys, values, self.pasts[j], self.scale, self.masks[j])[:1])
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return pad_rows(out, q.shape[0])
