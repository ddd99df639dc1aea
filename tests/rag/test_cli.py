"""`prefixrag ingest --warm` in process (typer's runner): ingest, then prefill every chunk's placement."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from rag.cli import app


def test_ingest_warm_prefills_every_chunk(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorblax.md").write_text(
        "# Zorblax\n\nThe Zorblax project is led by Ada Brennan. Its code is 4417."
    )
    (docs / "bakery.md").write_text("# Bakery\n\nThe bakery on Rue Mercière opens at seven.")
    result = CliRunner().invoke(app, ["ingest", str(docs), "--index", str(tmp_path / "index"), "--warm"])
    assert result.exit_code == 0, result.output
    warmed = re.search(r"warmed (\d+) chunks \(([\d,]+) tokens", result.output)
    assert warmed is not None, result.output
    assert int(warmed.group(1)) >= 2 and int(warmed.group(2).replace(",", "")) > 0
    assert "0 already cached" in result.output and "did not fit" not in result.output
