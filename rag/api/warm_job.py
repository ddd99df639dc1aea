"""A background warm-up of the chunk placements (``Pipeline.warm``), one per server at a time.

Started by ``POST /v1/cache/warm/chunks``, watched with ``GET``, cancelled with ``DELETE``: warming a large
index takes minutes, longer than an HTTP request should, and it competes with live requests for the
engine, which schedules both.

Example:
    >>> job = WarmJob(pipeline, namespace="m\\x1falice")       # doctest: +SKIP
    >>> job.start(); job.status()["state"]                      # doctest: +SKIP
    'running'
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Literal

log = logging.getLogger(__name__)

WarmState = Literal["running", "done", "cancelled", "failed"]


class WarmJob:
    """Runs ``pipeline.warm(namespace, collections=...)`` in a thread and reports its progress."""

    def __init__(self, pipeline: Any, namespace: str, collections: list[str] | None = None) -> None:
        self.pipeline = pipeline
        self.namespace = namespace
        self.collections = collections  # what the caller may read (None: every collection)
        self.cancel = threading.Event()
        self.done = 0
        self.total = 0
        self.report: Any = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="prefixrag-warm", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def state(self) -> WarmState:
        if self.running:
            return "running"
        if self.error is not None:
            return "failed"
        return "cancelled" if self.report is not None and self.report.cancelled else "done"

    def stop(self, wait_s: float = 60.0) -> None:
        """Cancel (takes effect between chunks) and wait for the thread."""
        self.cancel.set()
        self._thread.join(timeout=wait_s)

    def status(self) -> dict[str, Any]:
        return {
            "object": "cache.warm.chunks",
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "report": self.report.to_dict() if self.report is not None else None,
            "error": self.error,
        }

    def _progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def _run(self) -> None:
        try:
            self.report = self.pipeline.warm(
                self.namespace, cancel=self.cancel, progress=self._progress, collections=self.collections
            )
        except Exception as exc:  # reported by GET /v1/cache/warm/chunks
            log.exception("warming failed")
            self.error = f"{type(exc).__name__}: {exc}"
