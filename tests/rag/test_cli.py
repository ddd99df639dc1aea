"""`prefixrag` options that are checked before anything loads."""

import pytest
from typer.testing import CliRunner

from rag.cli import app


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
