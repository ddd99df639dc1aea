"""Field types that accept what JSON Schema says they accept: ``2.0`` is an integer, ``true`` and ``"2"``
are not numbers, only ``true``/``false`` are booleans; and request bodies whose text is valid Unicode."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, StrictBool, model_validator


def _number(value: Any) -> Any:
    if isinstance(value, (bool, str)):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return value


class RequestModel(BaseModel):
    """Base of request bodies: refuses strings that are not valid Unicode anywhere in the body.

    JSON's ``"\\ud800"`` escape decodes to a lone surrogate, which no tokenizer and no UTF-8 file
    accepts; better a 422 naming the field than a failure deep inside generation or ingestion.
    """

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = _lone_surrogate(data, "")
        if where is not None:
            raise ValueError(f"{where or 'body'}: not valid Unicode (it contains a lone surrogate)")
        return data


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string (or key) that cannot be encoded as UTF-8, else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            found = _lone_surrogate(key, here) if isinstance(key, str) else None
            found = found if found is not None else _lone_surrogate(item, here)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


Int = Annotated[int, BeforeValidator(_number)]
Float = Annotated[float, BeforeValidator(_number)]
Bool = StrictBool
