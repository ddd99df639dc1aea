"""Ingest-time settings of a saved index: recorded, adopted when a config leaves them unset,
refused when a config asks for another value."""

from __future__ import annotations

import json

import pytest

from rag.config import RAGConfig
from rag.knowledge_base import KnowledgeBase
from rag.stores.local.versions import current_version
from tests.rag.corpus import SMALL_CORPUS


def test_long_chunks_is_recorded_and_adopted(make_kb, tmp_path):
    kb = make_kb()
    kb.add_documents(SMALL_CORPUS[:2])
    kb.save(tmp_path)
    manifest = json.loads((current_version(tmp_path) / "manifest.json").read_text())
    assert manifest["config"]["long_chunks"] == "windows"
    assert KnowledgeBase.load(tmp_path, RAGConfig(top_k=2)).config.long_chunks == "windows"


def test_an_index_written_before_long_chunks_existed_was_truncated(make_kb, tmp_path):
    kb = make_kb()
    kb.add_documents(SMALL_CORPUS[:2])
    version = kb.save(tmp_path)
    manifest = json.loads((version / "manifest.json").read_text())
    del manifest["config"]["long_chunks"]
    (version / "manifest.json").write_text(json.dumps(manifest))
    assert KnowledgeBase.load(tmp_path).config.long_chunks == "truncate"
    # a config that leaves the field at its default keeps the index usable as it was built
    assert KnowledgeBase.load(tmp_path, RAGConfig(top_k=3)).config.long_chunks == "truncate"
    with pytest.raises(ValueError, match=r"long_chunks='truncate'.*re-ingest"):
        KnowledgeBase.load(tmp_path, RAGConfig(long_chunks="windows"))
