"""A private PostgreSQL server: ``initdb`` + ``pg_ctl`` in a temporary directory, on 127.0.0.1.

For trying the shared document store (``examples/cluster.py --private-postgres``) and for the tests:
a real server, reachable only from this host, with password authentication over TCP, removed again
by ``stop()``. Run as root, the server runs as the ``postgres`` OS user (PostgreSQL refuses to run
as root; Debian's package creates that user). The binaries are found on PATH or under
``/usr/lib/postgresql/<version>/bin`` (Debian: ``apt-get install postgresql-15``).

Example:
    >>> with PrivatePostgres() as server:                    # doctest: +SKIP
    ...     url = server.create_database("rag")
    ...     url
    'postgresql://postgres:...@127.0.0.1:41234/rag'
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

SERVER_USER = "postgres"
_DEBIAN_BINARIES = Path("/usr/lib/postgresql")


class PostgresNotFound(FileNotFoundError):
    """No PostgreSQL server binaries on this host."""


def find_binaries() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``; PostgresNotFound naming the package to install."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(
        (p for p in _DEBIAN_BINARIES.glob("*/bin") if (p / "pg_ctl").is_file()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1]
    raise PostgresNotFound(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql: "
        "install them (Debian: apt-get install postgresql-15)"
    )


class PrivatePostgres:
    """One throwaway server; ``port=0`` picks a free port. Superuser ``postgres`` with ``password``.

    Example:
        >>> server = PrivatePostgres().start()          # doctest: +SKIP
        >>> server.restart()                            # connections drop; the data stays
        >>> server.stop()                               # the directory is removed
    """

    def __init__(self, *, port: int = 0, password: str | None = None, log_path: Path | None = None) -> None:
        self.binaries = find_binaries()
        self.port = port or _free_port()
        self.password = password or secrets.token_urlsafe(12)
        self.root = Path(tempfile.mkdtemp(prefix="prefixrag-pg-"))
        self.data = self.root / "data"
        self.log_path = log_path or self.root / "server.log"
        self._as_server = os.geteuid() == 0  # root: run the server as the postgres user
        self.running = False

    def url(self, database: str = "postgres", *, user: str = SERVER_USER, password: str | None = None) -> str:
        secret = self.password if password is None else password
        return f"postgresql://{user}:{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self._initdb()
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log_path))
        self.running = True
        return self

    def restart(self) -> None:
        """Stop (fast: open connections are cut) and start again on the same data and port."""
        self._pg_ctl("restart", "-w", "-t", "60", "-m", "fast", "-l", str(self.log_path))

    def stop_server(self) -> None:
        """Stop the server, keeping its data (``start()`` brings it back)."""
        if self.running:
            self._pg_ctl("stop", "-w", "-t", "60", "-m", "fast")
            self.running = False

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        try:
            if self.running and self.data.exists():
                self._pg_ctl("stop", "-w", "-t", "60", "-m", "immediate")
        finally:
            self.running = False
            shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> PrivatePostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------------------
    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._as_server:
            shutil.chown(self.root, SERVER_USER)
            shutil.chown(pwfile, SERVER_USER)
        self._run(
            str(self.binaries / "initdb"),
            "-D", str(self.data), "-U", SERVER_USER, "--pwfile", str(pwfile),
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        pwfile.unlink()
        settings = (
            f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
            f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(settings)

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(self.binaries / "pg_ctl"), "-D", str(self.data), *args)

    def _run(self, *argv: str) -> None:
        command = ["runuser", "-u", SERVER_USER, "--", *argv] if self._as_server else list(argv)
        done = subprocess.run(command, capture_output=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            out = (done.stdout + done.stderr).decode(errors="replace").strip()
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): {out}\n{self.log()}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
