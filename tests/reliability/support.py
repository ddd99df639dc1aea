"""Helpers for the reliability tests: a server in a subprocess, response checks, latency figures.

Everything here is bounded: a subprocess server is always stopped (SIGINT, then SIGKILL) by its
context manager, and every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rag.api.schemas.openai import ChatCompletion, ChatCompletionChunk, Completion
from rag.api.schemas.rag import AddedDocuments, AskResponse
from tests.api.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux ``/proc``)."""
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class ServerProcess:
    """``prefixrag serve`` in a subprocess on 127.0.0.1, configured through ``PREFIXRAG_*`` variables.

    Example:
        >>> with ServerProcess(tmp_path, env={"PREFIXRAG_ENGINE__CACHE_BYTES": "67108864"}) as srv:  # doctest: +SKIP
        ...     httpx.get(srv.url + "/readyz")
    """

    def __init__(
        self, workdir: Path, *, env: Mapping[str, str] | None = None, index: Path | None = None
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.index = index or workdir / "index"
        self.log_path = workdir / f"server-{self.port}.log"
        self._env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **dict(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 240.0) -> ServerProcess:
        cmd = [sys.executable, "-m", "rag.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--index", str(self.index), "--log-level", "warning"]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self._env, stdout=log, stderr=subprocess.STDOUT)
        if not wait_until(self._ready, timeout=timeout, interval=0.25):
            self.stop()
            raise AssertionError(f"server not ready within {timeout} s:\n{self.log()}")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited early ({self.proc.returncode}):\n{self.log()}")
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs in the server."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- responses ------------------------------------------------------------------------------------


def sse_frames(text: str) -> list[tuple[str | None, str]]:
    """``(event name or None, data)`` of every server-sent event in a body."""
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            else:
                raise AssertionError(f"not an SSE line: {line!r}")
        frames.append((name, "\n".join(data)))
    return frames


def check_chat(body: dict[str, Any], max_tokens: int) -> str:
    """A valid chat.completion (the response model the OpenAPI schema documents); its text."""
    reply = ChatCompletion.model_validate(body)
    usage = reply.usage
    assert 0 < usage.completion_tokens <= max_tokens, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 <= usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens
    assert reply.choices[0].finish_reason in ("stop", "length")
    return reply.choices[0].message.content


def check_chat_stream(text: str, max_tokens: int) -> str:
    """A valid chat stream: role, content deltas, finish, usage, ``[DONE]``; the joined text."""
    frames = sse_frames(text)
    assert frames and frames[-1] == (None, "[DONE]"), frames[-3:]
    chunks = [ChatCompletionChunk.model_validate(json.loads(d)) for _, d in frames[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"]), finishes
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens <= max_tokens, chunks[-1]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def check_completion(body: dict[str, Any], max_tokens: int) -> str:
    reply = Completion.model_validate(body)
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= max_tokens
    return reply.choices[0].text


def check_ask(body: dict[str, Any], max_tokens: int) -> tuple[str, list[str]]:
    """A valid answer; its text and its sources (``doc_id#chunk_id``)."""
    answer = AskResponse.model_validate(body)
    assert 0 < answer.usage.completion_tokens <= max_tokens, answer.usage
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert 0 <= answer.usage.cached_tokens <= answer.usage.prompt_tokens
    return answer.text, [f"{s.doc_id}#{s.chunk_id}" for s in answer.sources]


def check_ask_stream(text: str, max_tokens: int) -> tuple[str, list[str]]:
    """A valid /v1/ask event stream: sources, deltas, usage, timings, done; text and sources."""
    frames = sse_frames(text)
    names = [n for n, _ in frames]
    assert names[0] == "sources" and names[-1] == "done", names
    assert "error" not in names, frames
    assert names[-3:-1] == ["usage", "timings"], names
    payloads = [json.loads(d) for _, d in frames]
    sources = [f"{s['doc_id']}#{s['chunk_id']}" for s in payloads[0]["sources"]]
    deltas = "".join(p["text"] for (n, _), p in zip(frames, payloads) if n == "delta")
    usage = payloads[-3]
    assert 0 < usage["completion_tokens"] <= max_tokens, usage
    return deltas, sources


def check_added(body: dict[str, Any], ids: list[str]) -> None:
    added = AddedDocuments.model_validate(body)
    assert added.ids == ids and added.count == len(ids), added


# ---- figures -------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Tally:
    """Outcomes of a load run: status codes, latencies (s), failures with their reason."""

    statuses: dict[int, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, status: int, seconds: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.latencies.append(seconds)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + len(self.failures)

    @property
    def errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 400) + len(self.failures)

    def summary(self) -> str:
        p50, p95 = percentile(self.latencies, 50), percentile(self.latencies, 95)
        mean = statistics.fmean(self.latencies) if self.latencies else 0.0
        return (
            f"{self.requests} requests, {self.errors} errors, statuses {dict(sorted(self.statuses.items()))}, "
            f"latency p50 {p50:.3f} s, p95 {p95:.3f} s, mean {mean:.3f} s"
        )
