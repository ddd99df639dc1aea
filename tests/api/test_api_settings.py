"""Settings from the environment: every server setting has one source, and a misplaced one fails loudly."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rag.api import Settings
from rag.api.services import build_pipeline


def test_engine_and_rag_variables_reach_the_pipeline(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFIXRAG_ENGINE__CACHE_BYTES", str(3 << 20))
    monkeypatch.setenv("PREFIXRAG_RAG__TOP_K", "6")
    monkeypatch.setenv("PREFIXRAG_INDEX_DIR", str(tmp_path / "index"))
    settings = Settings(warm_up=False)
    pipeline = build_pipeline(settings, engine=None)  # the engine would be built from config.engine
    assert pipeline.config.engine.cache_bytes == 3 << 20 == settings.engine.cache_bytes
    assert pipeline.config.top_k == 6 and pipeline.config.index_dir == tmp_path / "index"


@pytest.mark.parametrize(
    ("variable", "value", "instead"),
    [
        ("PREFIXRAG_RAG__ENGINE__CACHE_BYTES", "1048576", "PREFIXRAG_ENGINE__*"),
        ("PREFIXRAG_RAG__ENGINE__MODEL", "some-model", "PREFIXRAG_ENGINE__*"),
        ("PREFIXRAG_RAG__INDEX_DIR", "/srv/index", "PREFIXRAG_INDEX_DIR"),
        ("PREFIXRAG_RAG__DOCUMENT_STORE", "postgresql://rag@db/rag", "PREFIXRAG_DOCUMENT_STORE"),
    ],
)
def test_a_setting_the_server_would_ignore_is_an_error(monkeypatch, variable, value, instead):
    monkeypatch.setenv(variable, value)
    with pytest.raises(
        ValidationError, match=f"is not used by the server: set {instead.replace('*', '[*]')}"
    ):
        Settings()


def test_one_document_store_and_a_valid_url(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFIXRAG_DOCUMENT_STORE", "postgresql://rag:s3cret@db:5432/rag")
    assert Settings().document_store == "postgresql://rag:s3cret@db:5432/rag"
    with pytest.raises(ValidationError, match="name two stores: set one of them"):
        Settings(index_dir=tmp_path / "index")
    monkeypatch.setenv("PREFIXRAG_DOCUMENT_STORE", "mysql://rag:s3cret@db/rag")
    with pytest.raises(ValidationError, match="must be a PostgreSQL URL") as refused:
        Settings()
    assert "s3cret" not in str(refused.value).split("input_value")[0]  # the message hides the password
