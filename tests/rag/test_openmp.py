"""`prefixrag serve` hands libgomp its bounded spin before torch loads it (rag/openmp.py): checked in what
libgomp itself reports it was started with (``OMP_DISPLAY_ENV``), for both ways of starting the server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag.openmp import SERVE_SPINCOUNT, WAIT_VARIABLES, apply_serve_defaults, is_serve_command

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(sys.executable).parent / "prefixrag")
LIBGOMP_DEFAULT = "300000"  # libgomp's own spin when nothing is set


def started_spincount(command: list[str], **env: str) -> str:
    """The spin count libgomp reports at load in a process running ``command`` (a serve that stops at
    once: its API keys are invalid, which it finds after torch has loaded)."""
    base = {k: v for k, v in os.environ.items() if k not in WAIT_VARIABLES}
    base.update(OMP_DISPLAY_ENV="VERBOSE", PREFIXRAG_API_KEYS='{"short": "alice"}', **env)
    proc = subprocess.run(command, cwd=ROOT, env=base, capture_output=True, text=True, timeout=120)
    said = [
        line.split("=", 1)[1].strip(" '") for line in proc.stderr.splitlines() if "GOMP_SPINCOUNT" in line
    ]
    assert said, f"libgomp printed no settings (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return said[0]


@pytest.mark.parametrize(
    "command",
    [[SCRIPT, "serve", "--port", "1"], [sys.executable, "-m", "rag.cli", "serve", "--port", "1"]],
    ids=["console-script", "python-m"],
)
def test_serve_starts_openmp_with_the_bounded_spin(command):
    assert started_spincount(command) == SERVE_SPINCOUNT


def test_a_callers_wait_policy_wins():
    command = [SCRIPT, "serve", "--port", "1"]
    assert started_spincount(command, OMP_WAIT_POLICY="PASSIVE") == "0"
    assert started_spincount(command, GOMP_SPINCOUNT="2500") == "2500"


def test_other_commands_keep_libgomps_default():
    assert started_spincount([SCRIPT, "version"]) == LIBGOMP_DEFAULT


@pytest.mark.parametrize(
    ("argv", "serve"),
    [
        (["/v/bin/python3", "/v/bin/prefixrag", "serve", "--port", "8000"], True),
        (["python", "-m", "rag.cli", "serve"], True),
        (["python", "-m", "rag.cli", "demo"], False),
        (["python", "-m", "pytest", "serve"], False),
        (["python", "/v/bin/prefixrag"], False),
        (["python", "app.py", "serve"], False),
    ],
)
def test_is_serve_command(argv, serve):
    assert is_serve_command(argv) is serve


def test_apply_serve_defaults_leaves_a_set_wait_alone():
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    apply_serve_defaults(env, ["python", "-m", "rag.cli", "serve"])
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}
