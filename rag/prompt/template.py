"""Chat-template scaffolding for segment-wise tokenization.

A chat template wraps each message's content in fixed text (SmolLM2:
``<|im_start|>system\\n`` ... ``<|im_end|>\\n<|im_start|>user\\n`` ... ``<|im_end|>\\n<|im_start|>assistant\\n``).
`ChatLayout` learns that scaffolding by rendering the template once as text with a unique placeholder in
place of each message's content and splitting the result at the placeholders. The assembler then
tokenizes scaffolding pieces and content pieces separately and joins the ids, so a piece's ids never
depend on what follows it. A tokenizer without a chat template gets a plain ``System:/User:/Assistant:``
layout through the same code path.

Example:
    >>> layout = ChatLayout(tokenizer)                        # doctest: +SKIP
    >>> layout.scaffold(("system", "user"))                   # doctest: +SKIP
    ['<|im_start|>system\\n', '<|im_end|>\\n<|im_start|>user\\n', '<|im_end|>\\n<|im_start|>assistant\\n']
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SLOT = "@@PREFIXRAG_SLOT_{}@@"
_SLOT_MARK = "@@PREFIXRAG_SLOT_"
CONTEXT_CAP = 32_768  # default ceiling when the context length is read from the tokenizer/model config
FALLBACK_CONTEXT = 2_048  # when neither says anything usable
_CONFIG_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def plain_render(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """The layout used for tokenizers without a chat template: ``Role:\\n<content>\\n\\n`` per message."""
    text = "".join(f"{m['role'].capitalize()}:\n{m['content']}\n\n" for m in messages)
    return text + ("Assistant:\n" if add_generation_prompt else "")


class ChatLayout:
    """Scaffolding and tokenization of a tokenizer's chat format, with per-piece memoisation.

    Thread-safe: the memo is locked, and content is encoded by a private copy of the Rust tokenizer
    (``split_special_tokens=True`` on the shared one would flip state other threads read).
    """

    def __init__(self, tokenizer: Any, cache_size: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        self._cache_size = cache_size
        self._ids: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()
        self._scaffolds: dict[tuple[str, ...], list[str]] = {}
        self._lock = threading.Lock()
        self._encode_content = _content_encoder(tokenizer)

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The whole conversation as text, generation prompt included (what segment-wise ids decode to)."""
        if not self.has_template:
            return plain_render(messages)
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        assert isinstance(text, str), type(text)
        return text

    def scaffold(self, roles: Sequence[str]) -> list[str]:
        """The ``len(roles) + 1`` text pieces around the contents of messages with these roles.

        Raises ValueError when the template rejects the roles or does not render each content
        verbatim, once, in message order (segment-wise tokenization needs all three).
        """
        key = tuple(roles)
        pieces = self._scaffolds.get(key)
        if pieces is not None:
            return pieces
        slots = [{"role": role, "content": _SLOT.format(i)} for i, role in enumerate(key)]
        try:
            rendered = self.render(slots)
        except Exception as exc:  # jinja raise_exception, TemplateError, ...: the template's own message
            raise ValueError(f"chat template cannot render roles {list(key)}: {exc}") from exc
        pieces = _split_at_slots(rendered, len(key))
        if len(self._scaffolds) < 1024:  # one entry per role sequence seen; plenty for real chats
            self._scaffolds[key] = pieces
        return pieces

    def encode(self, text: str, *, content: bool = True) -> list[int]:
        """Token ids of one piece, memoised (LRU). Content never turns into special tokens."""
        return self.encode_many([text], content=content)[0]

    def encode_many(self, texts: Sequence[str], *, content: bool = True) -> list[list[int]]:
        """Like `encode` for several pieces; the misses go to the tokenizer in one batch."""
        with self._lock:
            known = {t: ids for t in texts if (ids := self._touch((t, content))) is not None}
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:
            fresh = self._encode_content(missing) if content else self._encode_scaffold(missing)
            known.update(zip(missing, fresh, strict=True))
            with self._lock:
                for text, ids in zip(missing, fresh, strict=True):
                    self._ids[(text, content)] = ids
                while len(self._ids) > self._cache_size:
                    self._ids.popitem(last=False)
        return [known[t] for t in texts]

    def _touch(self, key: tuple[str, bool]) -> list[int] | None:
        ids = self._ids.get(key)
        if ids is not None:
            self._ids.move_to_end(key)
        return ids

    def _encode_scaffold(self, texts: list[str]) -> list[list[int]]:
        # scaffolding's special tokens ("<|im_start|>") must be parsed as such
        encoded = self.tokenizer(texts, add_special_tokens=False, split_special_tokens=False)
        return [list(ids) for ids in encoded["input_ids"]]


# keyed by the Rust backend, weakly: the private copy does not keep the tokenizer alive
_ENCODERS: weakref.WeakKeyDictionary[Any, Callable[[list[str]], list[list[int]]]] = (
    weakref.WeakKeyDictionary()
)
_ENCODERS_LOCK = threading.Lock()


def _content_encoder(tokenizer: Any) -> Callable[[list[str]], list[list[int]]]:
    """Encodes content with special-token strings kept as text ("<|im_end|>" in a document can't end a turn)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):  # slow tokenizer: the flag is per call there
        return lambda texts: [
            list(ids)
            for ids in tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        ]
    with _ENCODERS_LOCK:  # fast: a private copy, costly to make, so shared by this tokenizer's assemblers
        encoder = _ENCODERS.get(backend)
        if encoder is None:
            encoder = _ENCODERS[backend] = _private_encoder(backend)
        return encoder


def _private_encoder(backend: Any) -> Callable[[list[str]], list[list[int]]]:
    from tokenizers import Tokenizer

    private = Tokenizer.from_str(backend.to_str())
    private.encode_special_tokens = True
    private.no_truncation()
    private.no_padding()
    return lambda texts: [enc.ids for enc in private.encode_batch(texts, add_special_tokens=False)]


def _split_at_slots(rendered: str, n: int) -> list[str]:
    pieces: list[str] = []
    rest = rendered
    for i in range(n):
        before, found, rest = rest.partition(_SLOT.format(i))
        if not found or _SLOT_MARK in before:
            raise ValueError(
                f"chat template does not render message {i}'s content verbatim and in order; "
                "segment-wise tokenization needs that"
            )
        pieces.append(before)
    if _SLOT_MARK in rest:
        raise ValueError("chat template renders a message's content more than once")
    pieces.append(rest)
    return pieces


def validate_messages(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    if not messages:
        raise ValueError("messages is empty; pass at least one {'role', 'content'} message")
    out = []
    for n, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise ValueError(f"messages[{n}] must be a dict with 'role' and 'content', got {msg!r}")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"messages[{n}] needs a str 'role' and a str 'content', got {dict(msg)!r}")
        out.append({"role": role, "content": content})
    return out


def fold_system(msgs: list[dict[str, str]]) -> list[dict[str, str]]:
    """Merge a leading system message into the next message, for templates without a system role."""
    first, second, *rest = msgs
    return [{"role": second["role"], "content": first["content"] + "\n\n" + second["content"]}, *rest]


def default_context_length(tokenizer: Any, cap: int = CONTEXT_CAP) -> int:
    """The model's context window: tokenizer.model_max_length if set, else the model config, capped."""
    n = getattr(tokenizer, "model_max_length", None)
    if not (isinstance(n, int) and 0 < n < 10_000_000):  # HF uses ~1e30 for "not set"
        n = _config_context_length(getattr(tokenizer, "name_or_path", "") or "")
    if n is None:
        log.warning("context length unknown for %r; assuming %d tokens", tokenizer, FALLBACK_CONTEXT)
        return FALLBACK_CONTEXT
    return min(n, cap)


def _config_context_length(name_or_path: str) -> int | None:
    config = Path(name_or_path) / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    for section in (data, data.get("text_config") or {}):
        for key in _CONFIG_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None
