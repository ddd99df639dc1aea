"""Values: what the cache stores per token. Anything sliceable along axis 0 with len() and .nbytes."""

from __future__ import annotations

from typing import Any


def value_nbytes(value: Any) -> int:
    """`value.nbytes` as an int, or ValueError naming the value's type."""
    try:
        return int(value.nbytes)
    except AttributeError:
        raise ValueError(
            f"value must have .nbytes (numpy array, torch tensor, KV segment), got {type(value).__name__}"
        ) from None


def copy_value(value: Any) -> Any:
    """A private copy of `value` (`.copy()`, else torch's `.clone()`), so no view keeps a larger buffer alive."""
    copy = getattr(value, "copy", None)
    if copy is None:
        copy = getattr(value, "clone", None)
    if copy is None:
        raise ValueError(f"value must support .copy() or .clone(), got {type(value).__name__}")
    return copy()


def check_value(value: Any, num_tokens: int) -> None:
    """ValueError unless `value` has one entry per token and an `.nbytes`."""
    try:
        n = len(value)
    except TypeError:
        raise ValueError(
            f"value must be sliceable along axis 0 with len(), got {type(value).__name__}"
        ) from None
    if n != num_tokens:
        raise ValueError(f"len(value) must equal len(tokens): got len(value)={n}, len(tokens)={num_tokens}")
    value_nbytes(value)
