"""Mapping OpenAI request fields onto the engine: messages, prompts and sampling parameters.

Pure functions; a request this server cannot honour raises ``InvalidRequest`` (answered with 400),
naming the parameter.
"""

from __future__ import annotations

from typing import Any

from engine.sampling import SamplingParams
from rag.api.errors import InvalidRequest
from rag.api.schemas.openai import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from rag.api.settings import Settings


def check_common(req: SamplingFields) -> None:
    """Refuse known options the engine does not implement, instead of silently ignoring them."""
    if (req.n or 1) != 1:
        raise InvalidRequest(f"n={req.n} is not supported: this server returns exactly one choice (n=1)", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise InvalidRequest(
                f"{name} is not supported (use repetition_penalty, a multiplicative penalty)", name
            )
    if req.logit_bias:
        raise InvalidRequest("logit_bias is not supported", "logit_bias")


def check_chat(req: ChatCompletionRequest) -> None:
    check_common(req)
    if req.logprobs or req.top_logprobs:
        raise InvalidRequest("logprobs are not supported", "logprobs")
    if req.tools:
        raise InvalidRequest("tools / function calling is not supported", "tools")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise InvalidRequest(
            f"response_format {req.response_format.get('type')!r} is not supported (only 'text')",
            "response_format",
        )


def check_completion(req: CompletionRequest) -> None:
    check_common(req)
    if req.echo:
        raise InvalidRequest("echo is not supported", "echo")
    if req.suffix:
        raise InvalidRequest("suffix is not supported", "suffix")
    if req.logprobs is not None:
        raise InvalidRequest("logprobs are not supported", "logprobs")
    if (req.best_of or 1) != 1:
        raise InvalidRequest("best_of > 1 is not supported", "best_of")


def chat_messages(messages: list[ChatMessage], settings: Settings) -> list[dict[str, str]]:
    """OpenAI messages -> the engine's ``[{"role", "content"}]`` (text parts joined; developer = system)."""
    if len(messages) > settings.max_messages:
        raise InvalidRequest(
            f"too many messages: {len(messages)} (at most {settings.max_messages})", "messages"
        )
    out = []
    for m in messages:
        content = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)
        out.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    return out


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The single prompt of a completions request: a string or token ids (batches are refused)."""
    p: Any = req.prompt
    if isinstance(p, str):
        return p
    if p and all(isinstance(x, list) for x in p):
        if len(p) != 1:
            raise InvalidRequest("batched prompts are not supported: send one prompt per request", "prompt")
        p = p[0]
    elif p and all(isinstance(x, str) for x in p):
        if len(p) != 1:
            raise InvalidRequest("batched prompts are not supported: send one prompt per request", "prompt")
        return str(p[0])
    if not p:
        raise InvalidRequest("prompt is empty", "prompt")
    return [int(t) for t in p]


def sampling_params(
    req: SamplingFields,
    settings: Settings,
    *,
    max_tokens: int | None,
    default_max_tokens: int,
    also_checked: int | None = None,
) -> SamplingParams:
    """OpenAI fields -> SamplingParams. OpenAI's defaults: temperature 1, top_p 1. A ``max_tokens`` (or
    ``also_checked``) over the server's limit is a 400, as OpenAI answers one over the model's."""
    wanted = max_tokens if max_tokens is not None else default_max_tokens
    too_large = settings.max_tokens_problem(wanted, also_checked)
    if too_large:
        raise InvalidRequest(too_large, "max_tokens")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > 16 or any(not s for s in stop):
        raise InvalidRequest("stop must be up to 16 non-empty strings", "stop")
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    if top_p == 0:  # OpenAI accepts 0: only the most likely token survives, i.e. greedy
        temperature, top_p = 0.0, 1.0
    try:
        return SamplingParams(
            max_tokens=wanted,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            seed=req.seed,
            repetition_penalty=req.repetition_penalty or 1.0,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
