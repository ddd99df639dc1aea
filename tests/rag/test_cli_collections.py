"""`prefixrag ingest --collection` and `prefixrag ask --collection` in subprocesses, on the real models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag.ingestion.store import KnowledgeBase

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFIXRAG_ENGINE__CACHE_BYTES": str(16 << 20), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "rag.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_ingest_and_ask_take_a_collection(tmp_path, embedder):
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "plan.md").write_text("# Plan\n\nThe Zorblax launch code is 4417.", encoding="utf-8")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "plan.md").write_text("# Plan\n\nThe ferry leaves at 7:40.", encoding="utf-8")
    index = tmp_path / "index"
    for name in ("team", "shared"):
        done = _cli("ingest", str(tmp_path / name), "--index", str(index), "--collection", name)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 added" in done.stdout and f"(collection {name})" in done.stdout
    kb = KnowledgeBase.load(index, embedder=embedder)
    assert kb.collections() == ["team", "shared"]
    assert "launch code" in kb.get_document("plan.md", "team").text  # type: ignore[union-attr]
    assert "ferry" in kb.get_document("plan.md", "shared").text  # type: ignore[union-attr]

    answer = _cli(
        "ask",
        "What is the launch code?",
        "--index",
        str(index),
        "--collection",
        "shared",
        "--max-tokens",
        "4",
        "--top-k",
        "2",
    )
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert "shared/plan.md" in answer.stdout and "team/plan.md" not in answer.stdout
    bad = _cli("ingest", str(tmp_path / "team"), "--index", str(index), "--collection", "../x")
    assert bad.returncode == 2 and "collection" in bad.stdout
