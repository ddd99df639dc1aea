"""The `make demo` path as a user runs it: `prefixrag ingest` (and `--warm`), `prefixrag ask` and `prefixrag demo` on a
small corpus, with their own $PREFIXRAG_HOME and index directory (the converted model is linked in, so
nothing is converted twice)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.models import DEFAULT_MODEL, converted_dir, resolve_model_path
from rag.cli import app


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A fresh $PREFIXRAG_HOME holding only a link to the converted default model."""
    resolve_model_path(DEFAULT_MODEL)  # converted once, in the real home
    home = tmp_path_factory.mktemp("prefixrag-home")
    model = converted_dir(DEFAULT_MODEL)
    (home / "models").mkdir()
    (home / "models" / model.name).symlink_to(model, target_is_directory=True)
    return home


@pytest.fixture
def user(home, monkeypatch) -> CliRunner:
    monkeypatch.setenv("PREFIXRAG_HOME", str(home))
    return CliRunner()


@pytest.mark.parametrize("store", ["index", "document-store"])
def test_ingest_then_ask(user, tmp_path, request, store):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "kestrel.md").write_text("# Kestrel lab\n\nThe Kestrel lab wifi password is bluefinch22.\n")
    (docs / "lyon.txt").write_text("The Lyon office has a blue door and a red bicycle rack.\n")
    index = tmp_path / "index"
    where = (
        ["--index", str(index)]
        if store == "index"
        else ["--document-store", request.getfixturevalue("postgres_url")]
    )

    first = user.invoke(app, ["ingest", str(docs), *where])
    assert first.exit_code == 0, first.output
    assert "2 added, 0 updated, 0 unchanged" in first.output
    assert (index / "CURRENT").exists() if store == "index" else "postgres:***@" in first.output
    again = user.invoke(app, ["ingest", str(docs), *where])
    assert "0 added, 0 updated, 2 unchanged" in again.output, again.output

    asked = user.invoke(app, ["ask", "What is the Kestrel lab wifi password?", *where, "--max-tokens", "12"])
    assert asked.exit_code == 0, asked.output
    assert "bluefinch" in asked.output and "kestrel.md" in asked.output
    assert "time to first token" in asked.output


def test_ask_without_an_index_says_so(user, tmp_path):
    asked = user.invoke(app, ["ask", "Hello?", "--index", str(tmp_path / "nothing"), "--max-tokens", "2"])
    assert asked.exit_code == 0, asked.output
    assert "no documents in" in asked.output


def test_demo_command(user, home):
    """`make demo` runs `prefixrag demo`; here on one topic and one question, asked twice."""
    shown = user.invoke(app, ["demo", "--topics", "1", "--questions", "1", "--max-tokens", "4"])
    assert shown.exit_code == 0, shown.output
    assert "corpus: Python language reference, 1 topics" in shown.output
    assert (home / "indexes" / "python-reference" / "CURRENT").exists()
    again = next(line for line in shown.output.splitlines() if "│ again" in line)
    prompt, cached = (int(cell) for cell in again.split("│")[3:5])
    assert cached == prompt  # the repeated question reuses all of it: its KV and its saved logits
    assert "prefix cache" in shown.output and "faster" in shown.output
    verdict = shown.output.split("exact reuse on this machine:")[1][:40]  # the engine's own verdict
    assert any(word in verdict for word in ("bit-exact", "within float rounding")), verdict


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_an_unknown_weights_format_is_a_clear_error(command, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXRAG_HOME", str(tmp_path))
    result = CliRunner().invoke(app, [command, "--weights", "int4"], terminal_width=200)
    assert result.exit_code == 2
    assert "invalid settings" in result.output and "'float32' or 'int8'" in result.output


def test_weights_option_is_documented():
    for command in ("demo", "serve"):
        result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
        assert result.exit_code == 0 and "--weights" in result.output and "int8" in result.output


def test_ingest_warm_prefills_every_chunk(user, home, tmp_path, monkeypatch):
    """`ingest --warm` prefills every chunk's placement for serve, into the disk tier it reads."""
    monkeypatch.setenv("PREFIXRAG_ENGINE__DISK_CACHE_BYTES", str(64 << 20))  # as serve has it by default
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorblax.md").write_text(
        "# Zorblax\n\nThe Zorblax project is led by Ada Brennan. Its code is 4417."
    )
    (docs / "bakery.md").write_text("# Bakery\n\nThe bakery on Rue Mercière opens at seven.")
    result = user.invoke(app, ["ingest", str(docs), "--index", str(tmp_path / "index"), "--warm"])
    assert result.exit_code == 0, result.output
    warmed = re.search(r"warmed (\d+) chunks \(([\d,]+) tokens", result.output)
    assert warmed is not None, result.output
    assert int(warmed.group(1)) >= 2 and int(warmed.group(2).replace(",", "")) > 0
    assert "0 already cached" in result.output and "did not fit" not in result.output
    assert any(f.is_file() for f in (home / "kv").rglob("*")), "no KV block reached the disk tier"
