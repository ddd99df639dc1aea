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


def _redis_or_skip() -> None:
    from rag.benchmark.redis_server import redis_server_binary

    if redis_server_binary() is None:
        reason = "redis-server is not installed (Debian: apt-get install redis-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real redis-server on 127.0.0.1 for the session (a free port, a temp folder, no persistence);
    tests take a database of their own. Skipped without the binary, except under CI=true."""
    from rag.benchmark.redis_server import RedisServer

    _redis_or_skip()
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_factory(tmp_path):
    """``redis_factory(maxmemory=...)``: a redis-server of the test's own (to kill, restart or bound),
    stopped at the end of the test."""
    from rag.benchmark.redis_server import RedisServer

    _redis_or_skip()
    servers: list[RedisServer] = []

    def make(**options) -> RedisServer:
        servers.append(RedisServer(tmp_path / f"redis-{len(servers)}", **options).start())
        return servers[-1]

    yield make
    for server in servers:
        server.stop()
