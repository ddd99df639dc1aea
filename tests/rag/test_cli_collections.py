"""`prefixrag ingest --collection` and `prefixrag ask --collection` as a user runs them (typer's runner,
in process), on the real models."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rag.cli import app
from rag.knowledge_base import KnowledgeBase


@pytest.fixture
def cli(monkeypatch) -> CliRunner:
    monkeypatch.setenv("PREFIXRAG_ENGINE__CACHE_BYTES", str(16 << 20))
    return CliRunner()


def _run(cli: CliRunner, *args: str) -> tuple[int, str]:
    """Exit code and output, with the console's line wrapping undone."""
    result = cli.invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


def test_ingest_and_ask_take_a_collection(cli, tmp_path, embedder):
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "plan.md").write_text("# Plan\n\nThe Zorblax launch code is 4417.", encoding="utf-8")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "plan.md").write_text("# Plan\n\nThe ferry leaves at 7:40.", encoding="utf-8")
    index = tmp_path / "index"
    for name in ("team", "shared"):
        code, out = _run(cli, "ingest", str(tmp_path / name), "--index", str(index), "--collection", name)
        assert code == 0, out
        assert "1 added" in out and f"(collection {name})" in out
    kb = KnowledgeBase.load(index, embedder=embedder)
    assert kb.collections() == ["team", "shared"]
    assert "launch code" in kb.get_document("plan.md", "team").text  # type: ignore[union-attr]
    assert "ferry" in kb.get_document("plan.md", "shared").text  # type: ignore[union-attr]

    question = ("What is the launch code?", "--index", str(index), "--max-tokens", "4", "--top-k", "2")
    code, out = _run(cli, "ask", *question, "--collection", "shared")
    assert code == 0, out
    assert "shared/plan.md" in out and "team/plan.md" not in out
    code, out = _run(cli, "ingest", str(tmp_path / "team"), "--index", str(index), "--collection", "../x")
    assert code == 2 and "collection" in out
