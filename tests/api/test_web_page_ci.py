"""Under CI a missing Chromium fails the browser test; on a developer's machine it skips it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.test_web_page import require_chromium

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_browser_skips_locally_and_fails_under_ci(tmp_path):
    with pytest.raises(pytest.skip.Exception, match="no Chromium at"):
        require_chromium(tmp_path / "no-chromium", in_ci=False)
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        require_chromium(tmp_path / "no-chromium", in_ci=True)
    assert require_chromium(Path(sys.executable), in_ci=True) == Path(sys.executable)


def test_ci_true_without_chromium_fails_the_run(tmp_path):
    env = {**os.environ, "CI": "true", "PREFIXRAG_CHROMIUM": str(tmp_path / "no-chromium")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/api/test_web_page.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "CI is set and the browser test cannot run" in proc.stdout, proc.stdout
