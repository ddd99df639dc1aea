"""PostgreSQL specifics: a wrong URL, password or database fails at open naming the problem (never
the password); vectors are stored as float32 bytes, not pickles; a knowledge base on the store
answers exactly as one on the local index directory; nothing needs pgvector."""

from __future__ import annotations

import re

import numpy as np
import psycopg
import pytest

from rag.config import RAGConfig
from rag.deploy.postgres import PrivatePostgres
from rag.knowledge_base import KnowledgeBase
from rag.stores import StoreError
from rag.stores.postgres import PostgresStore, probe
from tests.rag.corpus import SMALL_CORPUS


def test_a_wrong_url_password_or_database_fails_at_open_naming_the_problem(postgres: PrivatePostgres):
    cases = {
        postgres.url(
            "postgres", password="not-the-password"
        ): 'password authentication failed for user "postgres"',
        postgres.url("no_such_db"): 'database "no_such_db" does not exist',
        f"postgresql://postgres:x@127.0.0.1:{_closed_port()}/db": "Connection refused",
    }
    for url, reason in cases.items():
        for attempt in (lambda u=url: PostgresStore(u), lambda u=url: probe(u)):
            with pytest.raises(StoreError, match=re.escape(reason)) as refused:
                attempt()
            message = str(refused.value)
            assert "cannot open the document store postgresql://postgres:***@127.0.0.1" in message
            assert postgres.password not in message and "not-the-password" not in message
    with pytest.raises(ValueError, match="must be a PostgreSQL URL"):
        RAGConfig(document_store="mysql://root@localhost/db")
    with pytest.raises(ValueError, match="two stores"):
        RAGConfig(document_store=postgres.url(), index_dir="/tmp/index")


def test_a_knowledge_base_on_the_store_answers_as_on_the_local_directory(
    make_kb, embedder, llm_tokenizer, postgres_url, tmp_path
):
    from rag.ingestion.chunking import Chunker

    local = make_kb(index_dir=tmp_path / "index")
    shared = KnowledgeBase(
        RAGConfig(document_store=postgres_url), embedder=embedder, chunker=Chunker(llm_tokenizer)
    )
    for kb in (local, shared):
        kb.add_documents(SMALL_CORPUS[:3], collection="a")
        kb.add_documents(SMALL_CORPUS[3:], collection="b")
        kb.delete_document(SMALL_CORPUS[0].id, "a")
    assert shared.list_documents() == local.list_documents()
    for question in ("How do I remove the last item of a list?", "Why does a KV cache cut TTFT?"):
        for mode in ("dense", "bm25", "hybrid"):
            assert shared.search(question, 3, mode) == local.search(question, 3, mode)  # type: ignore[arg-type]
    reopened = KnowledgeBase(
        RAGConfig(document_store=postgres_url), embedder=embedder, chunker=Chunker(llm_tokenizer)
    )
    assert reopened.list_documents() == local.list_documents()
    assert reopened.search("What do cats do?", 2) == local.search("What do cats do?", 2)
    with psycopg.connect(postgres_url) as conn:  # vectors as raw float32 rows, and no extension used
        dim, data = conn.execute("SELECT dim, vectors FROM prefixrag.chunks LIMIT 1").fetchone()
        assert len(data) % (4 * dim) == 0 and np.isfinite(np.frombuffer(data, "<f4")).all()
        assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone() == (0,)
    for kb in (local, shared, reopened):
        kb.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
