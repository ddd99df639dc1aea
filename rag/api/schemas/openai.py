"""OpenAI-compatible request and response bodies (the subset this server implements, same field names).

Unknown request fields are ignored, as OpenAI-compatible servers do; known but unsupported options
(``n > 1``, logprobs, tools, penalties) are refused by the router with a 400 naming them.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag.api.schemas.rag import Collections, SourceOut
from rag.api.schemas.types import Bool, Float, Int, RequestModel

Role = Literal["system", "developer", "user", "assistant"]
NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[Int, Field(ge=0)]], Field(min_length=1)]


class StreamOptions(BaseModel):
    model_config = ConfigDict()

    include_usage: Bool = False


class ContentPart(BaseModel):
    """A text part of a message (images and audio are not supported)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A chat message; ``content`` may be a string or a list of ``{"type": "text", "text": ...}`` parts."""

    model_config = ConfigDict(extra="ignore")
    role: Role
    content: str | list[ContentPart]
    name: str | None = None


class SamplingFields(RequestModel):
    """Fields shared by /v1/chat/completions and /v1/completions (strict types: no "1" for 1)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(default=None, description="the served model id (default: the engine's)")
    max_tokens: Int | None = Field(default=None, ge=1)
    temperature: Float | None = Field(default=None, ge=0, le=2)
    top_p: Float | None = Field(default=None, ge=0, le=1, description="0 keeps only the top token (greedy)")
    n: Int | None = Field(default=None, ge=1, le=128)
    stream: Bool = False
    stream_options: StreamOptions | None = None
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=16)] | None = None
    seed: Int | None = Field(default=None, ge=-(2**53), le=2**53)
    presence_penalty: Float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: Float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, Float] | None = None
    user: str | None = None
    # extensions (vLLM's names)
    top_k: Int | None = Field(default=None, ge=-1, description="extension: top-k sampling (0 or -1: off)")
    repetition_penalty: Float | None = Field(default=None, ge=0.01, le=10, description="extension")
    ignore_eos: Bool = Field(
        default=False,
        description="extension: keep generating past the end-of-sequence token, to exactly max_tokens "
        "(stop strings still apply); what benchmark clients send",
    )
    cache_salt: str | None = Field(
        default=None,
        max_length=256,
        description="extension: subdivides the caller's cache namespace (never reaches another tenant's)",
    )


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(default=None, ge=1)
    logprobs: Bool | None = None
    top_logprobs: Int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    # extensions: retrieval-augmented chat
    rag: Bool = Field(
        default=False,
        description="extension: ground the reply on the caller's documents: the last user message "
        "retrieves passages (from the collections the key may read) that are added to it; the reply "
        "lists them in `sources`",
    )
    collections: Collections | None = Field(
        default=None, description="extension: retrieve only from these readable collections (implies rag)"
    )


class CompletionRequest(SamplingFields):
    prompt: (
        NonEmptyStr
        | Annotated[list[NonEmptyStr], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    echo: Bool | None = None
    suffix: str | None = None
    logprobs: Int | None = Field(default=None, ge=0, le=5)
    best_of: Int | None = Field(default=None, ge=1)


# ---- responses ------------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(default=0, description="prompt tokens reused from the exact prefix cache")
    stitched_tokens: int = Field(
        default=0,
        description="extension: prompt tokens whose KV came from cached chunks at other positions "
        "(reuse mode 'chunks'; approximate)",
    )
    stitch_deviation: float | None = Field(
        default=None,
        description="extension: how far a stitched prompt was from exact, 0 to 1 (the share of the "
        "question's attention on stitched chunk KV; null when nothing was stitched)",
    )


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(
        cls,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        stitched_tokens: int = 0,
        stitch_deviation: float | None = None,
    ) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(
                cached_tokens=cached_tokens,
                stitched_tokens=stitched_tokens,
                stitch_deviation=stitch_deviation,
            ),
        )

    @classmethod
    def of_result(cls, result: Any) -> Usage:
        """From an engine ``GenerationResult``."""
        return cls.of(
            result.prompt_tokens,
            result.cached_tokens,
            result.completion_tokens,
            getattr(result, "stitched_tokens", 0),
            getattr(result, "stitch_deviation", None),
        )


def finish_reason(reason: str | None) -> str:
    """OpenAI's ``finish_reason`` for the engine's: ``length`` when the token cap ended it, else ``stop``.

    >>> finish_reason("length"), finish_reason("cancelled"), finish_reason(None)
    ('length', 'stop', 'stop')
    """
    return reason if reason in ("stop", "length") else "stop"


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    sources: list[SourceOut] | None = Field(
        default=None, description="extension: the passages a `rag` chat was grounded on ([n] cites the n-th)"
    )


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    sources: list[SourceOut] | None = Field(
        default=None, description="extension: on the first chunk of a `rag` chat, its passages"
    )


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "prefixrag"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def new_id(prefix: str) -> str:
    """``chatcmpl-<hex>`` style ids."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
