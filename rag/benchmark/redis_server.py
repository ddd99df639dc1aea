"""RedisServer: a throwaway ``redis-server`` on 127.0.0.1 in a temp folder, for the benchmark's remote
tier section and the tests (a cache: no snapshots, no append-only file, ``allkeys-lru``).

Example:
    >>> with RedisServer(Path("/tmp/r"), maxmemory=64 << 20) as server:     # doctest: +SKIP
    ...     engine = Engine.from_pretrained(remote_cache_url=server.url())
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis


def redis_server_binary() -> str | None:
    """The ``redis-server`` on PATH (Debian's ``redis-server`` package), or None."""
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process; ``kill`` and ``start`` again (same port) for outage tests."""

    def __init__(self, workdir: Path, *, maxmemory: int = 0, port: int | None = None) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not on PATH (Debian: apt-get install redis-server)")
        self.binary = binary
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.maxmemory = maxmemory
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "redis.log"

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        args += ["--save", "", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru"]
        args += ["--maxmemory", str(self.maxmemory), "--enable-debug-command", "local"]
        args += ["--logfile", str(self.log_path)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited ({self.proc.returncode}): {err or self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"redis-server did not answer on port {self.port}: {self._log_tail()}")
            time.sleep(0.02)
        return self

    def client(self, db: int = 0) -> redis.Redis:
        """A client of database ``db`` (generous timeouts: for setting up and checking, not serving)."""
        return redis.Redis.from_url(self.url(db), socket_timeout=10)

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-call, as a crashed host's would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""
