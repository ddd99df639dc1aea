"""Field types that accept what JSON Schema says they accept: ``2.0`` is an integer, ``true`` and ``"2"``
are not numbers, and only ``true``/``false`` are booleans."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, StrictBool


def _number(value: Any) -> Any:
    if isinstance(value, (bool, str)):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return value


Int = Annotated[int, BeforeValidator(_number)]
Float = Annotated[float, BeforeValidator(_number)]
Bool = StrictBool
