"""Token keys: normalising token ids and finding shared-prefix lengths without per-token Python loops."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any


def as_token_list(tokens: Sequence[int] | Any) -> list[int]:
    """Return `tokens` as a list (a list is used as is, a numpy array via `tolist()`, once).

    The cache only reads this list and stores slices of it, never the list itself.
    """
    if isinstance(tokens, list):
        return tokens
    if isinstance(tokens, (str, bytes)):
        raise ValueError(
            f"tokens must be a sequence of int token ids, got {type(tokens).__name__} {tokens!r:.40}"
        )
    tolist = getattr(tokens, "tolist", None)
    if tolist is not None:
        if getattr(tokens, "ndim", 1) != 1:
            raise ValueError(f"tokens must be 1-D, got an array of shape {getattr(tokens, 'shape', '?')}")
        return tolist()
    try:
        return list(tokens)
    except TypeError:
        raise ValueError(f"tokens must be a sequence of int token ids, got {type(tokens).__name__}") from None


def child_key(tokens: list[int], i: int, page_size: int) -> Hashable:
    """The dict key of the child edge starting at tokens[i]: its first token, or first page as a tuple."""
    return tokens[i] if page_size == 1 else tuple(tokens[i : i + page_size])


def page_floor(n: int, page_size: int) -> int:
    """`n` rounded down to a whole number of pages."""
    return n - n % page_size


def common_prefix_len(key: list[int], tokens: list[int], start: int, stop: int) -> int:
    """Length of the common prefix of `key` and `tokens[start:stop]`.

    One C-level slice comparison in the usual case (the whole key matches); otherwise a binary search
    on slice equality, O(len) element comparisons in C and O(log len) Python steps.

    >>> common_prefix_len([5, 6, 7, 8], [0, 5, 6, 9], 1, 4)
    2
    """
    m = min(len(key), stop - start)
    if m <= 0:
        return 0
    if (key if m == len(key) else key[:m]) == tokens[start : start + m]:
        return m
    lo, hi = 0, m  # key[:lo] matches; the first mismatch is before hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[lo:mid] == tokens[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    return lo
