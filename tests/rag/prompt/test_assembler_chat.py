"""PromptAssembler.assemble_chat (chat with retrieval) against assemble, with the real SmolLM2 tokenizer:
the same layout, chunk order and budget; the conversation tokenized message by message."""

from __future__ import annotations

import doctest
from dataclasses import dataclass

import pytest

import rag.prompt.prompt
from rag.prompt.assembler import PromptAssembler, chat_question
from rag.prompt.public import public_prefix_length
from tests.rag.prompt.test_assembler import CHUNKS, QUESTION, TOOLS, FakeCache, chunk, decode, lcp


@dataclass(frozen=True)
class SharedChunk:
    doc_id: str
    chunk_id: str
    text: str
    score: float = 0.0
    collection: str = "shared"


HISTORY = [
    {"role": "user", "content": "Hello, who are you?"},
    {"role": "assistant", "content": "A helpful assistant."},
]


@pytest.fixture(scope="module")
def tokenizer():
    from engine.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def asm(tokenizer) -> PromptAssembler:
    return PromptAssembler(tokenizer, tools=TOOLS, pinned_context="Project handbook, v2.", order="canonical")


def test_a_one_message_chat_reads_exactly_the_prompt_of_its_question(asm):
    chat = asm.assemble_chat([{"role": "user", "content": QUESTION}], CHUNKS)
    plain = asm.assemble(QUESTION, CHUNKS)
    assert chat.token_ids == plain.token_ids and chat.segments == plain.segments
    assert chat.chunk_spans == plain.chunk_spans and chat.stable_length == plain.stable_length
    assert chat.chunk_ids == plain.chunk_ids


def test_a_conversation_keeps_its_turns_and_grounds_its_last_question(asm, tokenizer):
    messages = [*HISTORY, {"role": "user", "content": QUESTION}]
    p = asm.assemble_chat(messages, CHUNKS[:2])
    names = [s.name for s in p.segments]
    assert names == [
        "system",
        "tools",
        "pinned",
        "user:0",
        "assistant:1",
        "chunk:c00",
        "chunk:c01",
        "question",
    ]
    assert decode(tokenizer, p.token_ids) == p.text  # segment-wise ids decode to the template's text
    last = p.text.rsplit("<|im_start|>user\n", 1)[1].removesuffix("<|im_end|>\n<|im_start|>assistant\n")
    system = p.text.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, *HISTORY, {"role": "user", "content": last}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered == p.text and last.endswith(f"Question: {QUESTION}")
    assert p.stable_length == asm.assemble(QUESTION, []).stable_length  # only the assembler's own
    # the conversation before the chunks has the same ids whatever is retrieved: it hits the cache
    other = asm.assemble_chat(messages, CHUNKS[3:])
    first_chunk = p.segments[names.index("chunk:c00")].start
    assert lcp(p.token_ids, other.token_ids) >= first_chunk


def test_the_chat_uses_the_cache_aware_order_after_its_own_prefix(tokenizer):
    """The best-ranked chunk first (the cache never demotes it), then what the cache holds after it."""
    messages = [*HISTORY, {"role": "user", "content": QUESTION}]
    earlier = PromptAssembler(tokenizer, order="relevance").assemble_chat(messages, [CHUNKS[1], CHUNKS[4]])
    asm = PromptAssembler(tokenizer, order="cache", prefix_probe=FakeCache([earlier.token_ids]))
    p = asm.assemble_chat(messages, [CHUNKS[1], CHUNKS[3], CHUNKS[4]])
    assert p.chunk_ids == ["c01", "c04", "c03"]


def test_the_chat_keeps_to_the_budget_dropping_the_lowest_ranked_chunks(tokenizer):
    big = [chunk(n, words=60) for n in range(5)]
    messages = [*HISTORY, {"role": "user", "content": QUESTION}]
    full = PromptAssembler(tokenizer).assemble_chat(messages, big)
    alone = PromptAssembler(tokenizer).assemble_chat(messages, [])
    per_chunk = (len(full) - len(alone)) // 5
    limit = len(full) - 2 * per_chunk + 50 + 256
    p = PromptAssembler(tokenizer, max_context_tokens=limit).assemble_chat(messages, big)
    assert p.chunk_ids == ["c00", "c01", "c02"] and p.dropped_chunk_ids == ["c03", "c04"]
    assert len(p) <= limit - 256
    tight = PromptAssembler(tokenizer, max_context_tokens=len(alone) + 255)
    with pytest.raises(ValueError, match="budget"):
        tight.assemble_chat(messages, big)


def test_a_chat_with_its_own_system_message_has_no_stable_or_public_prefix(asm):
    own = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": QUESTION}]
    p = asm.assemble_chat(own, CHUNKS[:1])
    assert [s.name for s in p.segments] == ["system:0", "chunk:c00", "question"]
    assert "Answer in French." in p.text and asm.system_prompt not in p.text
    assert p.stable_length == 0 and not any(s.stable for s in p.segments)
    shared = [SharedChunk(doc_id="hb", chunk_id="h1", text="The ferry leaves at 7:40.")]
    assert public_prefix_length(asm.assemble_chat(own, shared), {"shared"}) == 0  # the system is theirs
    ours = asm.assemble_chat([{"role": "user", "content": QUESTION}], shared)
    assert public_prefix_length(ours, {"shared"}) == ours.segments[-1].start  # up to the question


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([{"role": "assistant", "content": "Hi"}], "needs a user message"),
        ([{"role": "user", "content": "  "}], "empty"),
        ([], "messages is empty"),
    ],
)
def test_what_a_chat_cannot_ground_is_a_clear_error(asm, messages, match):
    with pytest.raises(ValueError, match=match):
        chat_question(messages)
    with pytest.raises(ValueError, match=match):
        asm.assemble_chat(messages, CHUNKS)


def test_the_prompt_types_docstring_example():
    result = doctest.testmod(rag.prompt.prompt, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
