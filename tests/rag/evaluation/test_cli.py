"""`prefixrag eval-retrieval`: its options, its errors, and the JSON it writes."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from rag.cli import app
from rag.evaluation.cli import write_json_atomic


def test_help_lists_the_options():
    result = CliRunner().invoke(app, ["eval-retrieval", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in ("--split", "--index", "--questions", "--variants", "--rerankers", "--resamples", "--json"):
        assert option in result.output


def test_a_bad_split_is_a_clear_error_before_any_work(tmp_path):
    result = CliRunner().invoke(app, ["eval-retrieval", "--split", "test", "--index", str(tmp_path / "i")])
    assert result.exit_code == 2
    assert "split must be one of" in result.output
    assert not (tmp_path / "i").exists()  # nothing was built


def test_json_is_written_atomically(tmp_path):
    path = tmp_path / "out" / "figures.json"
    write_json_atomic(path, {"rows": [1, 2]})
    write_json_atomic(path, {"rows": [3]})
    assert json.loads(path.read_text()) == {"rows": [3]}
    assert [p.name for p in path.parent.iterdir()] == ["figures.json"]  # no temporary file left
