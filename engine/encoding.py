"""Prompts to token ids: text, token ids, or chat messages through the model's chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PromptInput = (
    str | Sequence[int] | Sequence[dict[str, Any]]
)  # what Engine.generate accepts; rag.Prompt is an assembled prompt


def encode_prompt(tokenizer: Any, prompt: PromptInput, vocab_size: int) -> list[int]:
    """Token ids for ``prompt``; ValueError naming what is wrong with it.

    Example:
        >>> encode_prompt(tok, [{"role": "user", "content": "Hi"}], 49152)   # doctest: +SKIP
        [1, 9690, 198, ...]
    """
    if isinstance(prompt, str):
        return encode_text(tokenizer, prompt)
    if not isinstance(prompt, (list, tuple)):
        raise ValueError(
            f"prompt must be a string, a list of token ids, or a list of chat messages, got {type(prompt).__name__}"
        )
    items = list(prompt)
    if items and all(isinstance(m, dict) for m in items):
        return render_chat(tokenizer, items)
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        bad = [t for t in items if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {vocab_size}): {bad[:5]}")
        return [int(t) for t in items]
    raise ValueError("prompt must be a string, a list of token ids, or a list of chat messages (dicts)")


def encode_text(tokenizer: Any, text: str) -> list[int]:
    try:
        return list(tokenizer.encode(text, add_special_tokens=True))
    except (TypeError, UnicodeError) as exc:  # e.g. lone surrogates the Rust tokenizer refuses
        raise ValueError(f"prompt text cannot be tokenized: {exc}") from exc


def render_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Chat messages through the tokenizer's chat template (a plain layout without one)."""
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} needs string 'role' and 'content', got {sorted(m)}")
    if getattr(tokenizer, "chat_template", None):
        try:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except (TypeError, UnicodeError) as exc:
            raise ValueError(f"chat messages cannot be tokenized: {exc}") from exc
        return [int(t) for t in ids]
    return encode_text(tokenizer, "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:")
