"""Fixtures for the rag tests: the real LLM tokenizer and knowledge bases over small corpora."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rag.config import RAGConfig
from rag.ingestion.chunking import Chunker
from rag.knowledge_base import KnowledgeBase
from tests.rag.corpus import SMALL_CORPUS


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
