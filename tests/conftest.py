"""Shared fixtures: the real bundled models, loaded once per session; a small tmpfs for full-disk tests;
a real PostgreSQL server (one per session, started on first use, stopped at the end) and a fresh
database on it per test.

Servers started by tests (``prefixrag serve`` subprocesses inherit this environment) keep the disk KV
tier off unless a test turns it on: tests never write into the user's ``$PREFIXRAG_HOME/kv``, and no
test sees blocks another test (or an earlier run) left there.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable, Iterator
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


_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """A private PostgreSQL server on 127.0.0.1 (``rag.deploy.postgres``) for the whole session.
    Without PostgreSQL the tests that need it are skipped, except under CI=true, where they fail."""
    from rag.deploy.postgres import PostgresNotFound, PrivatePostgres

    try:
        server = PrivatePostgres().start()
    except PostgresNotFound as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def new_database(postgres) -> Callable[[], str]:
    """Makes a fresh, empty database on the session's server; returns its URL."""
    return lambda: postgres.create_database(f"t{os.getpid()}_{next(_databases)}")


@pytest.fixture
def postgres_url(new_database) -> str:
    """The URL of a fresh, empty database for this test."""
    return new_database()


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
