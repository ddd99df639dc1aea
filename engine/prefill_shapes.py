"""Prefill shapes that make reuse of cached KV exact, bit for bit.

A token's keys, values and logits must not depend on how its prompt was split into forward calls (a
cached prefix and a suffix, prefill chunks, a prompt of another length that shares the prefix), or
reusing cached KV would change the model's output. On CPU three parts of a forward pass round
differently depending on the call's shape:
  * matmul rows: BLAS runs a handful of rows through other kernels than a large batch of them;
  * query blocks: torch's flash-attention kernel multiplies a block of one to three query rows by
    another GEMM path than a larger block;
  * key blocks: the kernel walks the keys in blocks of 512, and in the last, shorter block it takes
    ``exp`` of the last ``length % vector width`` keys with a scalar routine and BLAS splits the
    ``probabilities @ values`` sum by the block's length, so a query's result depends on the call's
    total key count.
So a prefill call runs at least ``QUERY_ROWS`` matmul rows, and each attention call a multiple of
``QUERY_ROWS`` query rows (padding rows after the real ones, never read back) over a multiple of
``KEY_BLOCK`` keys (the extra keys are finite and masked): every query meets full query blocks and
only full 512-key blocks, whatever the split. Rows are grouped by the key block their position falls
in (``key_block_spans``) so that each group reads only the blocks it can see.

Example:
    >>> prefill_rows(1), query_rows(17), aligned_keys(1000)
    (16, 32, 1024)
    >>> key_block_spans(past=1000, tokens=100)
    [(0, 24, 1024), (24, 100, 1536)]
    >>> prefill_mask(rows=2, past=3, keys=8).int().tolist()
    [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

QUERY_ROWS = 16  # query rows per prefill call: a multiple of this (matmul rows and query blocks)
KEY_BLOCK = 512  # keys per attention call in a prefill: a multiple of the CPU kernel's key block


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-n // multiple) * multiple


def prefill_rows(tokens: int) -> int:
    """Matmul rows a prefill call of ``tokens`` tokens runs (BLAS rounds fewer rows differently)."""
    return max(tokens, QUERY_ROWS)


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


def calibrate_query_rows(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, scale: float) -> int:
    """The fewest query rows whose attention result for the first row equals that row's in a full
    ``QUERY_ROWS`` block: a single decoded token padded to this many rows attends as a prefill would.

    The kernel runs blocks of one to three rows through another GEMM path; this finds where that ends.
    """
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, QUERY_ROWS, head_dim, generator=gen).to(dtype)
    k = torch.randn(1, kv_heads, KEY_BLOCK, head_dim, generator=gen).to(dtype)
    v = torch.randn(1, kv_heads, KEY_BLOCK, head_dim, generator=gen).to(dtype)
    past = KEY_BLOCK - QUERY_ROWS

    def first_row(rows: int) -> torch.Tensor:
        mask = prefill_mask(rows, past, KEY_BLOCK)
        out = F.scaled_dot_product_attention(
            q[:, :, :rows], k, v, attn_mask=mask, scale=scale, enable_gqa=heads != kv_heads
        )
        return out[:, :, 0]

    reference = first_row(QUERY_ROWS)
    return next(r for r in range(1, QUERY_ROWS + 1) if torch.equal(first_row(r), reference))
