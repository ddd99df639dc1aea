"""Prompt assembly: stable segments first, each tokenized on its own, through the model's chat template.

Layout (SmolLM2's template shown; any HF chat template works, a plain one is used without):

    <|im_start|>system\\n{system}  \\n\\n{tools}  \\n\\n{pinned}<|im_end|>\\n<|im_start|>user\\n    stable
    [1] (source: doc-a)\\n{chunk text}  \\n\\n[2] (source: doc-b)\\n{chunk text}  ...         chunks
    \\n\\nQuestion: {question}<|im_end|>\\n<|im_start|>assistant\\n                         question

Segments tile the prompt (two spaces above mark boundaries): each owns the separator before its
content and the template scaffolding after it (the first also the scaffolding before it), so
``token_ids[seg.start:seg.end]`` decodes to ``seg.text`` and the texts concatenate to the template's
rendering. Scaffolding, segment texts, chunk markers and chunk bodies are tokenized separately and
their ids joined, so the stable prefix (and any run of chunks) has the same ids whatever follows it:
what the engine's radix cache needs to hit. Separators lead the piece after them, which with
byte-level BPE makes the joined ids equal whole-text tokenization too (tested for SmolLM2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.sampling import DEFAULT_MAX_TOKENS
from rag.prompt.order import ORDERS, ChunkLike, PrefixProbe, canonical_key, fit_count, order_indices
from rag.prompt.prompt import Part, Prompt, Segment, join_parts
from rag.prompt.stand_in import STAND_IN_SOURCE, STAND_IN_TEXT
from rag.prompt.template import ChatLayout, default_context_length, fold_system, validate_messages

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ORDERS", "ChunkLike", "Prompt", "PromptAssembler", "Segment"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the question using only the numbered context passages "
    "in the user's message, and cite the passages you use as [n]. If the passages do not contain "
    "the answer, say that you do not know."
)
TOOLS_HEADER = "You can call these tools (JSON schemas):\n"
PINNED_HEADER = "Background:\n"
QUESTION_TEMPLATE = "Question: {question}"
CHUNK_TEMPLATE = " (source: {doc_id})\n{text}"  # follows the "[n]" marker
# Separators lead the piece after them: a piece that ends in "\n\n" tokenizes it as one token where
# the whole text would give "\n", "\n" (byte-level BPE splits whitespace before a word that way).
SEPARATOR = "\n\n"
CHUNK_SEGMENT = "chunk:"  # segment names of retrieved chunks: "chunk:<chunk_id>"


class PromptAssembler:
    """Lays out system prompt, tools, pinned context, retrieved chunks and question as token ids.

    Example:
        >>> from engine.models import load_tokenizer
        >>> asm = PromptAssembler(load_tokenizer(), order="canonical", max_tokens=256)  # doctest: +SKIP
        >>> prompt = asm.assemble("What is X?", retriever_hits)                         # doctest: +SKIP
        >>> prompt.token_ids[: prompt.stable_length] == asm.stable_ids                  # doctest: +SKIP
        True
        >>> [s.name for s in prompt.segments]                                           # doctest: +SKIP
        ['system', 'chunk:3f2a', 'chunk:9c1e', 'question']
    """

    def __init__(
        self,
        tokenizer: Any,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        tools: list[dict[str, Any]] | None = None,
        pinned_context: str | None = None,
        order: str = "relevance",
        max_context_tokens: int | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        prefix_probe: PrefixProbe | None = None,
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"unknown chunk order {order!r}; allowed: {', '.join(ORDERS)}")
        if not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a str, got {type(system_prompt).__name__}")
        if prefix_probe is not None and not callable(prefix_probe):
            raise ValueError("prefix_probe must be a callable (token ids -> cached length) or None")
        if not callable(tokenizer):
            raise ValueError(f"tokenizer must be a Hugging Face tokenizer, got {type(tokenizer).__name__}")
        self.max_context_tokens = (
            default_context_length(tokenizer) if max_context_tokens is None else max_context_tokens
        )
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if not isinstance(self.max_context_tokens, int) or self.max_context_tokens <= max_tokens:
            raise ValueError(
                f"max_context_tokens ({self.max_context_tokens!r}) must be an int larger than "
                f"max_tokens ({max_tokens})"
            )
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tools_text = render_tools(tools or [])
        self.pinned_context = pinned_context or ""
        self.order = order
        self.max_tokens = max_tokens
        self.prefix_probe = prefix_probe
        self._layout = ChatLayout(tokenizer)
        self._stable_parts, self._tail = self._build_stable()
        self.stable_ids: list[int] = [i for part in self._stable_parts for i in part.ids]
        # what stands between the anchor and a reused chunk at its canonical placement
        stand_in = CHUNK_TEMPLATE.format(doc_id=STAND_IN_SOURCE, text=STAND_IN_TEXT)
        self.chunk_context: list[int] = self._layout.encode(stand_in) + self._marker(1)
        if len(self.stable_ids) >= self.budget:
            raise ValueError(
                f"system prompt, tools and pinned context take {len(self.stable_ids)} tokens, leaving no "
                f"room in the budget of {self.budget} (max_context_tokens - max_tokens)"
            )

    @property
    def budget(self) -> int:
        """Prompt tokens allowed: the context window minus what is reserved for generation."""
        return self.max_context_tokens - self.max_tokens

    def assemble(
        self,
        question: str,
        chunks: Sequence[ChunkLike],
        *,
        prefix_probe: PrefixProbe | None = None,
        order: str | None = None,
    ) -> Prompt:
        """Token ids for a grounded question; ``chunks`` ranked best first (lowest ranks drop first).

        ``prefix_probe`` overrides the assembler's for this call, e.g. one bound to the request's
        cache namespace (tenant) for the ``cache`` order; ``order`` overrides its chunk order (e.g.
        ``CHUNKS_MODE_ORDER`` for a ``reuse="chunks"`` request).
        """
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty string, got {question!r}")
        probe = self.prefix_probe if prefix_probe is None else prefix_probe
        return self._grounded([*self._stable_parts], question, chunks, self._tail, [], probe, order)

    def assemble_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        chunks: Sequence[ChunkLike],
        *,
        prefix_probe: PrefixProbe | None = None,
        order: str | None = None,
    ) -> Prompt:
        """Token ids for a chat grounded on ``chunks``: its last user message is the question, laid out
        as ``assemble`` lays one out (chunks in the same order, within the same budget, then
        ``Question: ...``); the messages around it are tokenized one by one, as ``assemble_messages``
        does. A chat without a system message of its own opens with this assembler's stable prefix,
        so a one-message chat gets exactly the ids ``assemble`` gives its question. The chat's own
        messages, system ones included, are the caller's: never stable (never public material).
        """
        question = chat_question(messages)
        msgs = validate_messages(messages)
        head, tail, after = self._chat_frame(msgs, _last_user(msgs))
        probe = self.prefix_probe if prefix_probe is None else prefix_probe
        return self._grounded(head, question, chunks, tail, after, probe, order)

    def _grounded(
        self,
        head: list[Part],
        question: str,
        chunks: Sequence[ChunkLike],
        tail: str,
        after: list[Part],
        probe: PrefixProbe | None,
        order: str | None = None,
    ) -> Prompt:
        """``head``, the chunks that fit (in ``order``, default this assembler's, after ``head``), the
        question closed by ``tail``, then ``after``."""
        if order is not None and order not in ORDERS:
            raise ValueError(f"unknown chunk order {order!r}; allowed: {', '.join(ORDERS)}")
        ranked = _dedupe(chunks)
        bodies = self._layout.encode_many([chunk_body(c) for c in ranked])
        head_ids = [i for part in head for i in part.ids]
        fixed = len(head_ids) + sum(len(part.ids) for part in after)
        question_part, kept = self._fit(question, bodies, fixed, tail)

        def ids_at(i: int, pos: int) -> list[int]:
            return self._marker(pos) + bodies[i]

        perm = order_indices(order or self.order, ranked[:kept], head_ids, ids_at, probe)
        chunk_parts = [self._chunk_part(ranked[i], pos, bodies[i]) for pos, i in enumerate(perm)]
        return join_parts(
            [*head, *chunk_parts, question_part, *after],
            chunks=[ranked[i] for i in perm],
            dropped=[str(c.chunk_id) for c in ranked[kept:]],
            chunk_context=self.chunk_context,
        )

    def placement(self, chunk: ChunkLike) -> list[int]:
        """The ids of a prompt that begins with ``chunk``: the stable prefix, the first ``[n]`` marker
        and the chunk's body (its exact prefix wherever it comes first; what warming prefills)."""
        return [*self.stable_ids, *self._marker(0), *self._layout.encode(chunk_body(chunk))]

    def stitch_placement(self, chunk: ChunkLike) -> list[int]:
        """The ids ``chunk``'s KV is cached under for ``chunks`` reuse wherever it is not first: the
        stable prefix, ``[1]``, the stand-in passage (``rag.prompt.stand_in``), ``[2]`` and the
        chunk's body (also what warming prefills)."""
        return [
            *self.stable_ids,
            *self._marker(0),
            *self.chunk_context,
            *self._layout.encode(chunk_body(chunk)),
        ]

    def _fit(self, question: str, bodies: list[list[int]], fixed: int, tail: str) -> tuple[Part, int]:
        """The question part and how many best-ranked chunks fit beside it and the ``fixed`` tokens
        around it (stable prefix, other messages) within the budget."""
        alone = self._question_part(question, False, tail)
        base = fixed + len(alone.ids)
        if base > self.budget:
            raise ValueError(
                f"question takes {len(alone.ids)} tokens; with the {fixed} tokens of the stable prefix "
                f"and other messages that is {base}, over the budget of {self.budget} tokens "
                f"(max_context_tokens {self.max_context_tokens} - max_tokens {self.max_tokens})"
            )
        if not bodies:
            return alone, 0
        after = self._question_part(question, True, tail)
        lengths = [len(self._marker(n)) + len(b) for n, b in enumerate(bodies)]
        kept = fit_count(fixed + len(after.ids), lengths, self.budget)
        return (after, kept) if kept else (alone, 0)

    def assemble_messages(self, messages: Sequence[Mapping[str, str]]) -> Prompt:
        """Token ids for a plain chat, one segment per message (``"<role>:<index>"``).

        Each message is tokenized on its own, so turn N's ids are a prefix of turn N+1's ids and a
        multi-turn conversation hits the prefix cache. Leading system messages are the stable part.
        """
        msgs = validate_messages(messages)
        try:
            scaffold = self._layout.scaffold([m["role"] for m in msgs])
        except ValueError:
            if msgs[0]["role"] != "system" or len(msgs) < 2:
                raise
            msgs = fold_system(msgs)  # template without a system role (Gemma-style)
            scaffold = self._layout.scaffold([m["role"] for m in msgs])
        contents = self._layout.encode_many([m["content"] for m in msgs])
        parts: list[Part] = []
        leading_system = True
        for i, (msg, ids) in enumerate(zip(msgs, contents, strict=True)):
            leading_system = leading_system and msg["role"] == "system"
            part = Part(f"{msg['role']}:{i}", leading_system)
            if i == 0:
                part.add(scaffold[0], self._layout.encode(scaffold[0], content=False))
            after = scaffold[i + 1]
            parts.append(part.add(msg["content"], ids).add(after, self._layout.encode(after, content=False)))
        prompt = join_parts(parts)
        if len(prompt) > self.budget:
            raise ValueError(
                f"conversation takes {len(prompt)} tokens, over the budget of {self.budget} tokens "
                f"(max_context_tokens {self.max_context_tokens} - max_tokens {self.max_tokens})"
            )
        return prompt

    # -- pieces -----------------------------------------------------------------------------------
    def _build_stable(self) -> tuple[list[Part], str]:
        """Stable parts (ids computed once) and the scaffolding that closes the user message."""
        texts = self._system_texts()
        head, middle, (tail,) = self._frame(bool(texts), ["user"])
        return self._opening(texts, head, middle, stable=True), tail

    def _system_texts(self) -> list[tuple[str, str]]:
        """(segment name, text) of this assembler's system content that is present."""
        texts = [
            ("system", self.system_prompt),
            ("tools", self.tools_text),
            ("pinned", PINNED_HEADER + self.pinned_context if self.pinned_context else ""),
        ]
        return [(name, text) for name, text in texts if text]

    def _opening(self, texts: list[tuple[str, str]], head: str, middle: str, *, stable: bool) -> list[Part]:
        """The parts of the system content ``texts`` (joined by separators), from the scaffolding
        ``head`` before it to ``middle`` after it."""
        parts: list[Part] = []
        for n, (name, text) in enumerate(texts):
            part = Part(name, stable)
            if n == 0:
                part.add(head, self._layout.encode(head, content=False))
            piece = text if n == 0 else SEPARATOR + text
            parts.append(part.add(piece, self._layout.encode(piece)))
        if not parts:  # no system content: the template's own default system message, if any
            parts.append(Part("system", stable).add(head, self._layout.encode(head, content=False)))
        parts[-1].add(middle, self._layout.encode(middle, content=False))
        return [p for p in parts if p.ids]

    def _frame(self, has_system: bool, roles: Sequence[str]) -> tuple[str, str, list[str]]:
        """Scaffolding of system content followed by messages with ``roles``: (before the system
        content, between it and the first message, after each message)."""
        if has_system:
            try:
                head, middle, *between = self._layout.scaffold(("system", *roles))
                return head, middle, between
            except ValueError:
                pass  # no system role: system content opens the first message instead
        head, *between = self._layout.scaffold(tuple(roles))
        return head, SEPARATOR if has_system else "", between

    def _chat_frame(self, msgs: list[dict[str, str]], last: int) -> tuple[list[Part], str, list[Part]]:
        """A grounded chat's parts before its question (opening, earlier messages), the scaffolding
        that closes the question's message, and the parts of the messages after it."""
        n_system = next((i for i, m in enumerate(msgs) if m["role"] != "system"), len(msgs))
        own = [(f"system:{i}", m["content"]) for i, m in enumerate(msgs[:n_system])]
        texts = own or self._system_texts()
        rest = msgs[n_system:]
        head, middle, between = self._frame(bool(texts), [m["role"] for m in rest])
        parts = self._opening(texts, head, middle, stable=not own)
        ask = last - n_system
        messages = [
            Part(f"{m['role']}:{n_system + i}", False)
            .add(m["content"], self._layout.encode(m["content"]))
            .add(between[i], self._layout.encode(between[i], content=False))
            for i, m in enumerate(rest)
            if i != ask
        ]
        return parts + messages[:ask], between[ask], messages[ask:]

    def _marker(self, pos: int) -> list[int]:
        return self._layout.encode(_marker_text(pos))

    def _chunk_part(self, chunk: ChunkLike, pos: int, body_ids: list[int]) -> Part:
        marker = _marker_text(pos)
        part = Part(f"{CHUNK_SEGMENT}{chunk.chunk_id}", False).add(marker, self._marker(pos))
        part.body_start = len(part.ids)
        return part.add(chunk_body(chunk), body_ids)

    def _question_part(self, question: str, after_chunks: bool, tail: str) -> Part:
        text = (SEPARATOR if after_chunks else "") + QUESTION_TEMPLATE.format(question=question.strip())
        part = Part("question", False).add(text, self._layout.encode(text))
        return part.add(tail, self._layout.encode(tail, content=False))


def render_tools(tools: list[dict[str, Any]]) -> str:
    """Tool schemas, one canonical JSON per line (sorted keys, no whitespace), in the given order."""
    lines = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"tools[{n}] must be a dict (a JSON schema), got {type(tool).__name__}")
        try:
            lines.append(json.dumps(tool, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tools[{n}] is not JSON-serialisable: {exc}") from exc
    return TOOLS_HEADER + "\n".join(lines) if lines else ""


def _marker_text(pos: int) -> str:
    return f"{SEPARATOR if pos else ''}[{pos + 1}]"


def chunk_body(chunk: ChunkLike) -> str:
    """A chunk as it appears after its ``[n]`` marker (position-independent, so memoisable)."""
    return CHUNK_TEMPLATE.format(doc_id=chunk.doc_id, text=chunk.text.strip())


def _dedupe(chunks: Sequence[ChunkLike]) -> list[ChunkLike]:
    """Drop repeats of a (doc_id, chunk_id), keeping the best-ranked one."""
    seen: set[tuple[str, str]] = set()
    out = []
    for chunk in chunks:
        key = canonical_key(chunk)
        if key not in seen:
            seen.add(key)
            out.append(chunk)
    return out


def chat_question(messages: Sequence[Mapping[str, str]]) -> str:
    """What a grounded chat asks: its last user message (ValueError if it has none, or an empty one)."""
    msgs = validate_messages(messages)
    question = msgs[_last_user(msgs)]["content"]
    if not question.strip():
        raise ValueError("the last user message is empty: nothing to retrieve for")
    return question


def _last_user(messages: list[dict[str, str]]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            return i
    raise ValueError("a grounded chat needs a user message: its last one is what is retrieved for")
