"""The numerics tests (marked ``numerics``: exact reuse and its self-check, bfloat16, KV formats, int8,
chunk stitching's rotation) under every narrower code path this CPU can emulate, each in a fresh
process with the libraries limited by environment variables (engine.isa). The native path is the
rest of this suite. A path that fails is a failure here, never a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.isa import code_paths
from engine.quant.linear import int8_backend

ROOT = Path(__file__).resolve().parents[2]
NARROWER = [p for p in code_paths() if p.env]
PATH_VARIABLE = "PREFIXRAG_CODE_PATH"  # set in the child: which path it is meant to run (test_numerics_paths reads it too)


@pytest.mark.parametrize("path", NARROWER, ids=[p.name for p in NARROWER])
def test_numerics_hold_on_a_narrower_path(path):
    env = {**os.environ, **path.env, PATH_VARIABLE: path.name}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "numerics", "tests/engine"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, f"{path.name} ({path.description}):\n{tail}"
    assert " passed" in tail and "skipped" not in tail, tail


@pytest.mark.numerics
def test_the_libraries_run_the_path_asked_for():
    """In a child of the test above: the variables really narrowed what torch, oneDNN and MKL use."""
    name = os.environ.get(PATH_VARIABLE, "native")
    path = next(p for p in code_paths() if p.name == name)
    capability = torch.backends.cpu.get_cpu_capability()
    if path.env.get("ATEN_CPU_CAPABILITY") == "avx2":
        assert capability == "AVX2"
    if path.env.get("ONEDNN_MAX_CPU_ISA") == "AVX2":
        # without VNNI oneDNN's int8 pair sums saturate: the probe must have refused it
        assert int8_backend() in ("fbgemm", None)
    if name == "native":
        assert capability in ("AVX512", "AVX2", "DEFAULT", "ZVECTOR", "VSX")
