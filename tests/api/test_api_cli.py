"""`prefixrag serve` in a subprocess: it loads the model, answers, and stops cleanly on SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rag.openmp import SERVE_SPINCOUNT, WAIT_VARIABLES
from tests.api.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_serve_command(tmp_path):
    port = _free_port()
    env = {**os.environ, "PREFIXRAG_ENGINE__CACHE_BYTES": str(64 << 20), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "rag.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--index", str(tmp_path / "index"), "--log-level", "warning"]
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early:\n{(tmp_path / 'server.log').read_text()}")
        try:
            return httpx.get(url + "/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        assert wait_until(ready, timeout=240, interval=0.5), (tmp_path / "server.log").read_text()
        assert httpx.get(url + "/healthz").json() == {"status": "ok"}
        reply = httpx.post(url + "/v1/completions", json={"prompt": "Hello,", "max_tokens": 3}, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
        cache = httpx.get(url + "/v1/cache").json()["cache"]
        assert cache["capacity_bytes"] == 64 << 20  # PREFIXRAG_ENGINE__CACHE_BYTES reached the engine
        assert httpx.get(url + "/").status_code == 200
        threads = httpx.get(url + "/server_info").json()["threads"]
        # serve bounds OpenMP's spin before torch loads, unless the caller's environment set a wait
        caller = {name.lower(): os.environ.get(name) for name in WAIT_VARIABLES}
        bounded = {"omp_wait_policy": None, "gomp_spincount": SERVE_SPINCOUNT}
        assert threads == {"torch": threads["torch"], **(caller if any(caller.values()) else bounded)}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        log.close()
    assert code == 0, (tmp_path / "server.log").read_text()
    time.sleep(0.1)
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/healthz", timeout=2)


def test_serve_rejects_bad_settings():
    env = {**os.environ, "PREFIXRAG_API_KEYS": '{"short": "alice"}'}
    proc = subprocess.run(
        [sys.executable, "-m", "rag.cli", "serve", "--port", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "8 characters" in proc.stdout + proc.stderr


def test_serve_refuses_a_setting_it_would_ignore():
    """The server's engine has one source (PREFIXRAG_ENGINE__*); the copy nested in rag fails at startup
    (every misplaced variable: tests/api/test_api_settings.py)."""
    env = {**os.environ, "PREFIXRAG_RAG__ENGINE__CACHE_BYTES": "1048576"}
    proc = subprocess.run(
        [sys.executable, "-m", "rag.cli", "serve", "--port", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 2
    assert "(PREFIXRAG_RAG__ENGINE__*) is not used by the server: set PREFIXRAG_ENGINE__* instead" in said, (
        said
    )
