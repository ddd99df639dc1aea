"""Shared fixtures: the real bundled models, loaded once per session; a small tmpfs for full-disk tests.

Servers started by tests (``prefixrag serve`` subprocesses inherit this environment) keep the disk KV
tier off unless a test turns it on: tests never write into the user's ``$PREFIXRAG_HOME/kv``, and no
test sees blocks another test (or an earlier run) left there.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("PREFIXRAG_ENGINE__DISK_CACHE_BYTES", "0")


@pytest.fixture(scope="session")
def loaded_model():
    from engine.models import load_model

    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def embedder():
    from rag.retrieval.embedder import Embedder

    emb = Embedder()
    emb.warm_up()
    return emb


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (a disk that fills up: writes fail with ENOSPC); skipped where mounting is not
    allowed, except under CI=true, where the full-disk tests must run."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        reason = f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
