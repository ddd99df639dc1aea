"""Bodies of the cache routes: POST /v1/cache/warm."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from rag.api.schemas.openai import ChatMessage
from rag.api.schemas.rag import PRINTABLE_ID, VISIBLE_TEXT
from rag.api.schemas.types import RequestModel

WarmPrompt = (
    Annotated[str, Field(min_length=1, json_schema_extra={"pattern": VISIBLE_TEXT})]
    | Annotated[list[ChatMessage], Field(min_length=1)]
)


class CacheWarmRequest(RequestModel):
    """``{"prompts": [text or chat messages, ...], "tenant"?: str}``: what to prefill, for whom."""

    model_config = ConfigDict(extra="forbid")

    prompts: list[WarmPrompt] = Field(
        min_length=1,
        max_length=256,
        description="texts (as /v1/completions takes) or message lists (as chat)",
    )
    tenant: str = Field(
        default="",
        max_length=64,
        pattern=PRINTABLE_ID,
        description="the tenant whose cache to warm (default: the anonymous one)",
    )
