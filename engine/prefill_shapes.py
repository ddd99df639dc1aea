"""Prefill shapes that make reuse of cached KV exact, bit for bit.

A token's keys, values and logits must not depend on how its prompt was split into forward calls (a
cached prefix and a suffix, prefill chunks, a prompt of another length that shares the prefix), or
reusing cached KV would change the model's output. On CPU three parts of a forward pass round
differently depending on the call's shape:
  * matmul rows: BLAS and oneDNN choose kernels and thread splits by the row count; every matmul of
    a prefill runs as tiles whose sizes give each row the same bits (``engine.row_tiles``);
  * query rows: torch's flash-attention kernel cuts a call's queries into blocks whose size depends
    on the call's query count, and multiplies each block by a GEMM of that many rows; the queries of
    an attention call run as tiles too (:func:`attention_menu`), padding rows after the real ones;
  * key blocks: the kernel walks the keys in blocks of 512, and in a last, shorter block it takes
    ``exp`` of the last ``length % vector width`` keys with a scalar routine and BLAS splits the
    ``probabilities @ values`` sum by the block's length, so a query's result would depend on the
    call's total key count.
So every attention call of a prefill runs a multiple of ``KEY_BLOCK`` keys (the extra keys are finite
and masked) under an explicit causal mask, never the kernel's own causal path, whose last key block
is as short as the query's position: every query meets only full 512-key blocks, whatever the split.
Rows are grouped by the key block their position falls in (``key_block_spans``) so that each group
reads only the blocks it can see.

Example:
    >>> query_rows(17), aligned_keys(1000)
    (32, 1024)
    >>> key_block_spans(past=1000, tokens=100)
    [(0, 24, 1024), (24, 100, 1536)]
    >>> prefill_mask(rows=2, past=3, keys=8).int().tolist()
    [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.row_tiles import TILE, TileMenu, cached_menu, calibrate, problem_rows, round_up

QUERY_ROWS = TILE  # query rows per attention tile, and the fewest matmul rows a prefill call runs
KEY_BLOCK = 512  # keys per attention call in a prefill: a multiple of the CPU kernel's key block
ATTENTION_CANDIDATES = (32, 64, 128, 256, 512)  # a key-block span holds at most KEY_BLOCK queries

__all__ = [
    "KEY_BLOCK",
    "QUERY_ROWS",
    "aligned_keys",
    "attention_menu",
    "key_block_spans",
    "prefill_mask",
    "query_rows",
    "round_up",
]

# attend(queries [R, H, D], keys [1, KVH, K, D], values, past, mask [R, K]) -> [R, H * D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor], torch.Tensor]


def query_rows(queries: int) -> int:
    """Query rows an attention call over ``queries`` real queries runs: whole ``QUERY_ROWS`` groups."""
    return round_up(max(queries, 1), QUERY_ROWS)


def aligned_keys(length: int) -> int:
    """Keys an attention call over ``length`` real keys runs (the rest are masked padding)."""
    return round_up(max(length, 1), KEY_BLOCK)


def key_block_spans(past: int, tokens: int) -> list[tuple[int, int, int]]:
    """The queries ``[0, tokens)`` (query ``i`` at position ``past + i``) split where their position
    enters a new key block: ``(start, end, keys)``, ``keys`` being what that span's queries can see."""
    spans = []
    start = 0
    while start < tokens:
        end = min(tokens, round_up(past + start + 1, KEY_BLOCK) - past)
        spans.append((start, end, aligned_keys(past + end)))
        start = end
    return spans


def prefill_mask(rows: int, past: int, keys: int, device: Any = "cpu") -> torch.Tensor:
    """``[rows, keys]`` bool: query ``i`` (at position ``past + i``) sees keys ``0 .. past + i``."""
    return torch.ones(rows, keys, dtype=torch.bool, device=device).tril(diagonal=past)


def attention_menu(
    attend: Attend, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, scale: float
) -> TileMenu:
    """The query-tile menu of ``attend`` for this geometry on this machine (measured once per process):
    the query counts whose every row equals its ``QUERY_ROWS``-row call's, over masked full key blocks."""
    key = ("attention", heads, kv_heads, head_dim, dtype, scale)
    return cached_menu(key, lambda: _calibrate_attention(attend, heads, kv_heads, head_dim, dtype))


def _calibrate_attention(
    attend: Attend, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> TileMenu:
    gen = torch.Generator().manual_seed(0)
    rows = problem_rows(ATTENTION_CANDIDATES)
    past = KEY_BLOCK  # the queries sit at positions past .. past + rows, their keys in later blocks
    keys = aligned_keys(past + rows)
    q = torch.randn(rows, heads, head_dim, generator=gen).to(dtype)
    # keys/values as views into a longer store, as a KV buffer hands them out
    k = torch.randn(1, kv_heads, 2 * keys, head_dim, generator=gen).to(dtype)[:, :, :keys]
    v = torch.randn(1, kv_heads, 2 * keys, head_dim, generator=gen).to(dtype)[:, :, :keys]

    def run(start: int, size: int) -> torch.Tensor:
        return attend(q[start : start + size], k, v, past + start, prefill_mask(size, past + start, keys))

    with torch.inference_mode():
        return calibrate(run, ATTENTION_CANDIDATES)
