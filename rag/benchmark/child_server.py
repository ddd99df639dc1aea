"""A benchmark server in a subprocess: its log, and a stop that never leaves it running.

Example:
    >>> class Echo(ChildServer):                                        # doctest: +SKIP
    ...     def start(self) -> "Echo": ...
    >>> with Echo(Path("/tmp/echo.log")) as server:                     # doctest: +SKIP
    ...     print(server.log_tail())
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Self


class ChildServer:
    """What every benchmark server shares: ``process``, ``log_path``; subclasses define ``start``."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def log_tail(self, lines: int = 8) -> str:
        """The log's last ``lines`` lines on one line (what a failed start reports)."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s: the process is gone when this returns."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
