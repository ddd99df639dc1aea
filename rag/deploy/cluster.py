"""Scale-out on one host: N ``prefixrag serve`` replicas behind sglang-router, started and stopped together.

A prefix cache only pays when requests that share a prefix reach the replica that holds it.
sglang-router's ``cache_aware`` policy keeps an approximate radix tree of the text it sent to each
worker (chat: the messages' contents; completions: the prompt) and sends a request to the worker with
the longest match when that covers more than ``--cache-threshold`` (0.3) of its text; otherwise to the
least-loaded worker, where load is the router's count of requests in flight (ties: the first worker,
so a strictly sequential client sees every new prefix go to the same replica). ``round_robin``
ignores prefixes.

Every process runs in its own process group, listens on 127.0.0.1 (by default) on a free port, and
writes its log to ``log_dir``; ``stop()`` (or leaving the ``with`` block) sends SIGTERM to the router,
then to every replica (each finishes its in-flight requests), and SIGKILLs any group still alive after
its grace period, so nothing is left behind.

Example:
    >>> with Cluster(replicas=2, policy="cache_aware") as cluster:            # doctest: +SKIP
    ...     client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="none")
    ...     client.chat.completions.create(model=cluster.model, messages=[...])
    ...     [s["cache"]["hit_rate"] for s in cluster.cache_stats()]
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

import httpx

from engine.models import DEFAULT_MODEL

Policy = Literal["cache_aware", "round_robin", "random", "power_of_two"]
POLICIES: tuple[str, ...] = ("cache_aware", "round_robin", "random", "power_of_two")


class ManagedProcess:
    """A child process in its own process group, its output in a log file; ``stop`` ends the group.

    Example:
        >>> p = ManagedProcess("sleeper", ["sleep", "60"], log_path=Path("/tmp/sleeper.log")).start()
        >>> p.alive
        True
        >>> p.stop(grace_s=5)    # SIGTERM to the group, SIGKILL after 5 s
        >>> p.alive
        False
    """

    def __init__(
        self, name: str, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() reaches its children too
        )
        return self

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (no-op once it has exited)."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def wait(self, timeout_s: float) -> bool:
        """True once the process has exited, False if it is still running after ``timeout_s``."""
        if self.popen is None:
            return True
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the group, wait up to ``grace_s``, then SIGKILL whatever is left."""
        self.signal(signal.SIGTERM)
        self.kill_after(grace_s)

    def kill_after(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for an exit already asked for, then SIGKILL the group."""
        if not self.wait(grace_s):
            self.signal(signal.SIGKILL)
            self.wait(10)
        if self.popen is not None:  # reap stragglers of the group that outlived the leader
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 30) -> str:
        """The last lines of the process's log (for error messages)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Replica:
    """One ``prefixrag serve`` process on ``host``; ``port=0`` picks a free one.

    Example:
        >>> with Replica(log_dir=Path("/tmp/logs"), warm_up=False) as r:         # doctest: +SKIP
        ...     httpx.get(r.url + "/health").json()
        {'status': 'ok'}
    """

    def __init__(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        model: str = DEFAULT_MODEL,
        index_dir: Path | None = None,
        document_store: str | None = None,
        log_dir: Path,
        threads: int | None = None,
        warm_up: bool = False,
        shutdown_timeout_s: int = 30,
        env: Mapping[str, str] | None = None,
        name: str = "replica",
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.model = model
        self.name = name
        self.document_store = document_store
        self.index_dir = None if document_store else index_dir or log_dir / f"{name}-index"
        self.shutdown_timeout_s = shutdown_timeout_s
        extra = {
            **(
                {"PREFIXRAG_DOCUMENT_STORE": document_store} if document_store else {}
            ),  # not in argv: ps shows argv
            "PREFIXRAG_WARM_UP": str(warm_up).lower(),
            "PREFIXRAG_SHUTDOWN_TIMEOUT_S": str(shutdown_timeout_s),
            "TOKENIZERS_PARALLELISM": "false",
            **(
                {"PREFIXRAG_ENGINE__NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
                if threads
                else {}
            ),
            **(env or {}),
        }
        argv = [sys.executable, "-m", "rag.cli", "serve", "--host", host, "--port", str(self.port)]
        argv += ["--index", str(self.index_dir)] if self.index_dir is not None else []
        argv += ["--model", model, "--log-level", "warning"]
        self.process = ManagedProcess(name, argv, log_path=log_dir / f"{name}.log", env=child_env(extra))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Replica:
        self.process.start()
        return self

    def ready(self) -> bool:
        """True once ``/health`` says 200 (the model is loaded); raises if the process died."""
        if not self.process.alive:
            raise RuntimeError(
                f"{self.name} ({self.url}) exited with code {self.process.returncode} during startup:\n"
                f"{self.process.tail()}"
            )
        return _get_ok(self.url + "/health")

    def wait_ready(self, timeout_s: float = 180.0) -> Replica:
        wait_for([self.ready], timeout_s, f"{self.name} at {self.url}")
        return self

    def cache_stats(self, api_key: str | None = None) -> dict[str, Any]:
        """``GET /v1/cache`` of this replica: its prefix cache's counters and the engine's."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        reply = httpx.get(self.url + "/v1/cache", headers=headers, timeout=10)
        reply.raise_for_status()
        return dict(reply.json())

    def stop(self) -> None:
        self.process.stop(self.shutdown_timeout_s + 15)

    def __enter__(self) -> Replica:
        return _started(self)

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Router:
    """sglang-router (``python -m sglang_router.launch_router``) in front of ``worker_urls``.

    Ready once it counts every worker healthy. Its Prometheus exporter binds ``host`` too, on a free
    port (by default it takes 0.0.0.0:29000, and a second router on the host would fail to start).

    Example:
        >>> with Router(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], "round_robin",
        ...             log_dir=Path("/tmp/logs")) as router:                          # doctest: +SKIP
        ...     httpx.get(router.url + "/workers").json()["total"]
        2
    """

    def __init__(
        self,
        worker_urls: Sequence[str],
        policy: Policy = "cache_aware",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_dir: Path,
        startup_timeout_s: int = 180,
        shutdown_grace_s: int = 10,
        extra_args: Sequence[str] = (),
        name: str = "router",
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if not worker_urls:
            raise ValueError("a router needs at least one worker URL")
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.host = host
        self.port = port or free_port(host)
        self.shutdown_grace_s = shutdown_grace_s
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *self.worker_urls]
        argv += ["--policy", policy, "--host", host, "--port", str(self.port)]
        argv += ["--prometheus-host", host, "--prometheus-port", str(free_port(host))]
        argv += ["--log-level", "warn", "--worker-startup-timeout-secs", str(startup_timeout_s)]
        argv += ["--worker-startup-check-interval", "1", "--health-check-interval-secs", "5"]
        argv += ["--shutdown-grace-period-secs", str(shutdown_grace_s), *extra_args]
        self.process = ManagedProcess(name, argv, log_path=log_dir / f"{name}.log", env=child_env({}))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Router:
        self.process.start()
        return self

    def healthy_workers(self) -> int:
        """How many workers the router counts as healthy (``GET /readiness``); raises if it died."""
        if not self.process.alive:
            raise RuntimeError(
                f"the router exited with code {self.process.returncode}:\n{self.process.tail()}"
            )
        try:
            reply = httpx.get(self.url + "/readiness", timeout=2)
            return int(reply.json().get("healthy_workers", 0))
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            return 0

    def wait_ready(self, timeout_s: float = 60.0) -> Router:
        """Wait until the router counts every worker healthy."""
        expected = len(self.worker_urls)
        wait_for([lambda: self.healthy_workers() >= expected], timeout_s, f"the router at {self.url}")
        return self

    def stop(self) -> None:
        self.process.stop(self.shutdown_grace_s + 5)

    def __enter__(self) -> Router:
        return _started(self)

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Cluster:
    """``replicas`` x ``prefixrag serve`` behind one sglang-router, as a context manager.

    ``threads_per_replica`` defaults to the cores divided among the replicas (torch threads of
    several processes fighting over the same cores slow every one of them down). With
    ``document_store`` (a PostgreSQL URL) every replica serves the same documents: a write through
    any replica is served by all. Otherwise each replica gets its own empty index, or, with one
    replica, ``index_dir`` (a local index directory has one writer: several replicas are refused).

    Example:
        >>> with Cluster(replicas=2, policy="round_robin") as c:      # doctest: +SKIP
        ...     print(c.url, c.worker_urls)
        http://127.0.0.1:41234 ['http://127.0.0.1:40111', 'http://127.0.0.1:40112']
    """

    def __init__(
        self,
        replicas: int = 2,
        policy: Policy = "cache_aware",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = DEFAULT_MODEL,
        index_dir: Path | None = None,
        document_store: str | None = None,
        threads_per_replica: int | None = None,
        warm_up: bool = False,
        startup_timeout_s: float = 240.0,
        shutdown_timeout_s: int = 30,
        log_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        router_args: Sequence[str] = (),
    ) -> None:
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if index_dir is not None and document_store is not None:
            raise ValueError("index_dir and document_store name two stores: give one of them")
        if index_dir is not None and replicas > 1:
            raise ValueError(
                f"{replicas} replicas cannot share the index directory {index_dir}: it has a single "
                "writer (each replica would keep its own copy and lose the others' writes); give them "
                "one shared store with --document-store postgresql://... instead"
            )
        self.policy = policy
        self.model = model
        self.document_store = document_store
        self.startup_timeout_s = startup_timeout_s
        self._own_log_dir = log_dir is None  # made on start (by the first log file), removed on stop
        self.log_dir = Path(
            log_dir or Path(tempfile.gettempdir()) / f"prefixrag-cluster-{uuid.uuid4().hex[:8]}"
        )
        threads = threads_per_replica or max(1, (os.cpu_count() or 1) // replicas)
        self.replicas = [
            Replica(
                host=host,
                model=model,
                index_dir=index_dir,
                document_store=document_store,
                log_dir=self.log_dir,
                threads=threads,
                warm_up=warm_up,
                shutdown_timeout_s=shutdown_timeout_s,
                env=env,
                name=f"replica-{i}",
            )
            for i in range(replicas)
        ]
        self.router = Router(
            [r.url for r in self.replicas],
            policy,
            host=host,
            port=port,
            log_dir=self.log_dir,
            startup_timeout_s=int(startup_timeout_s),
            extra_args=router_args,
        )
        self._started = False

    @property
    def url(self) -> str:
        """The router's base URL (OpenAI clients: ``url + "/v1"``)."""
        return self.router.url

    @property
    def worker_urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def start(self) -> Cluster:
        """Start every replica, wait until all are ready, then the router; stops all on failure."""
        self._started = True
        atexit.register(self.stop)
        try:
            for replica in self.replicas:
                replica.start()
            wait_for([r.ready for r in self.replicas], self.startup_timeout_s, "the replicas")
            self.router.start().wait_ready(60)
        except BaseException:
            self.stop(keep_logs=True)
            raise
        return self

    def cache_stats(self, api_key: str | None = None) -> list[dict[str, Any]]:
        """Each replica's ``GET /v1/cache``, in replica order."""
        return [r.cache_stats(api_key) for r in self.replicas]

    def stop(self, keep_logs: bool = False) -> None:
        """Router first (no new requests), then every replica at once; idempotent."""
        if not self._started:
            return
        self._started = False
        atexit.unregister(self.stop)
        self.router.stop()
        for replica in self.replicas:
            replica.process.signal(signal.SIGTERM)
        for replica in self.replicas:
            replica.process.kill_after(replica.shutdown_timeout_s + 15)
        if self._own_log_dir and not keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop(keep_logs=exc_type is not None)


def _started(server: Any) -> Any:
    """``server.start().wait_ready()``, stopping it again if it never gets ready."""
    try:
        return server.start().wait_ready()
    except BaseException:
        server.stop()
        raise


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for(checks: Sequence[Callable[[], bool]], timeout_s: float, what: str) -> None:
    """Poll until every check holds; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pending = list(checks)
    while pending:
        pending = [check for check in pending if not check()]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not become ready within {timeout_s:g} s")
        time.sleep(0.25)


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus ``extra``, with this checkout first on PYTHONPATH (children
    run the same ``rag`` code as the parent, whatever their working directory)."""
    root = str(Path(__file__).resolve().parents[2])  # the checkout (rag/deploy/cluster.py)
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _get_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
