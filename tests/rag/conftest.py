"""Fixtures for the rag tests: the real LLM tokenizer and knowledge bases over small corpora."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rag.chunking import Chunker
from rag.config import RAGConfig
from rag.documents import Document
from rag.store import KnowledgeBase

# A small corpus with one clearly right answer per question below.
SMALL_CORPUS = [
    Document(
        id="cats.md",
        text="# Cats\n\nCats are small domesticated felines. A cat purrs when content and sleeps most of the day.",
        metadata={"source": "cats.md"},
    ),
    Document(
        id="python-lists.txt",
        text="Python lists\n\nA list is a mutable sequence. Use append() to add an item and pop() to remove "
        "the last one. Lists can be sorted in place with list.sort().",
    ),
    Document(
        id="paris.html",
        text="Paris\n\nThe Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889.",
        metadata={"title": "Paris landmarks"},
    ),
    Document(
        id="kv-cache.md",
        text="# KV cache\n\nPrefill computes keys and values for every prompt token; a prefix KV cache lets "
        "the model reuse them for a repeated prefix, which cuts the time to first token.",
    ),
]


@pytest.fixture(scope="session")
def llm_tokenizer():
    from engine.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def chunker(llm_tokenizer) -> Chunker:
    return Chunker(llm_tokenizer)


@pytest.fixture
def make_kb(embedder, llm_tokenizer) -> Callable[..., KnowledgeBase]:
    """A fresh in-memory KnowledgeBase sharing the session's embedder and tokenizer."""

    def make(**config: object) -> KnowledgeBase:
        cfg = RAGConfig.model_validate(config)
        chunker = Chunker(llm_tokenizer, cfg.chunk_size, cfg.chunk_overlap)
        return KnowledgeBase(cfg, embedder=embedder, chunker=chunker)

    return make


@pytest.fixture(scope="session")
def small_kb(embedder, llm_tokenizer) -> KnowledgeBase:
    """Read-only: the SMALL_CORPUS indexed with the default config."""
    kb = KnowledgeBase(embedder=embedder, chunker=Chunker(llm_tokenizer))
    kb.add_documents(SMALL_CORPUS)
    return kb
