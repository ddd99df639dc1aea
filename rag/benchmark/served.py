"""Servers measured from outside, by one client: prefixrag's own server in a subprocess, and the figures
an OpenAI-compatible client sees of any server (prefixrag's, vLLM's).

:func:`client_figures` times what a user of the server would: time to the first streamed chunk that
carries text for a ~1,500-token prompt never seen before (cold), the same prompt again (warm), the
same prompt with its last ~20 tokens changed, and decode ms/token after the long prompt and after a
short one (``(last token - first token) / (tokens - 1)``, tokens from the server's usage). Every figure
is the median of ``repeats``; each cold prompt starts with a fresh nonce so that nothing of it can be
cached.

Example:
    >>> with PrefixragServer(dtype="auto") as server:                              # doctest: +SKIP
    ...     client_figures(server.base_url, server.model, tokenizer, context)       # doctest: +SKIP
    {'cold_ttft_s': 0.31, 'warm_ttft_s': 0.04, ...}
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from engine.models import DEFAULT_MODEL
from rag.benchmark.child_server import ChildServer
from rag.benchmark.vllm_peer import free_port

TIMEOUT = httpx.Timeout(600.0, connect=10.0)
START_TIMEOUT_S = 600.0


def stream_chat(
    client: httpx.Client, base_url: str, model: str, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    """One streamed chat completion, timed at its first content chunk and its last; greedy, EOS ignored.
    ``client`` keeps its connection open between requests, as an OpenAI client's session does."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    first = last = None
    usage: dict[str, Any] = {}
    t0 = time.perf_counter()
    with client.stream("POST", f"{base_url}/chat/completions", json=body, timeout=TIMEOUT) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter() - t0
                    first = now if first is None else first
                    last = now
    tokens = int(usage.get("completion_tokens") or 0)
    return {
        "ttft_s": first if first is not None else float("nan"),
        "last_s": last if last is not None else float("nan"),
        "tokens": tokens,
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
    }


def _messages(context: str, question: str, nonce: str = "") -> list[dict[str, str]]:
    system = f"{nonce}You answer questions about Python using only the reference text below.\n\n{context}"
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def client_figures(
    base_url: str, model: str, context: str, questions: list[str], repeats: int = 3, decode_tokens: int = 64
) -> dict[str, Any]:
    """Cold, warm and last-20-tokens-differ TTFT of the long prompt, and decode ms/token at long and
    short context, medians of ``repeats`` (the first request of each kind, a warm-up, is not counted)."""
    cold, warm, differ, long_decode, short_decode = [], [], [], [], []
    prompt_tokens = 0
    with httpx.Client() as client:
        chat = functools.partial(stream_chat, client, base_url, model)
        chat(_messages(context, questions[0], f"warm-up {uuid.uuid4().hex}. "), 2)
        for i in range(repeats):
            nonce = f"Session {uuid.uuid4().hex}. "
            ask = _messages(context, questions[i % len(questions)], nonce)
            first = chat(ask, 1)
            cold.append(first["ttft_s"])
            prompt_tokens = first["prompt_tokens"]
            warm.append(chat(ask, 1)["ttft_s"])
            other = _messages(context, questions[(i + 1) % len(questions)], nonce)
            differ.append(chat(other, 1)["ttft_s"])
            answer = chat(ask, decode_tokens)
            long_decode.append((answer["last_s"] - answer["ttft_s"]) / max(answer["tokens"] - 1, 1))
            short = chat([{"role": "user", "content": "Tell me a story."}], decode_tokens)
            short_decode.append((short["last_s"] - short["ttft_s"]) / max(short["tokens"] - 1, 1))
    return {
        "prompt_tokens": prompt_tokens,
        "repeats": repeats,
        "cold_ttft_s": statistics.median(cold),
        "warm_ttft_s": statistics.median(warm),
        "differ_ttft_s": statistics.median(differ),
        "decode_long_ms": 1000 * statistics.median(long_decode),
        "decode_short_ms": 1000 * statistics.median(short_decode),
    }


class PrefixragServer(ChildServer):
    """``prefixrag serve`` in a subprocess on 127.0.0.1 (no index, no disk tier), stopped on exit.

    ``engine``: ``PREFIXRAG_ENGINE__*`` settings, e.g. ``{"dtype": "float32", "weights": "int8"}``.
    """

    def __init__(self, engine: dict[str, str] | None = None, log_dir: Path | None = None) -> None:
        self.engine = dict(engine or {})
        self.port = free_port()
        self.model = DEFAULT_MODEL
        super().__init__((log_dir or Path("/tmp")) / f"prefixrag-serve-{self.port}.log")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def label(self) -> str:
        settings = ", ".join(f"{k} {v}" for k, v in self.engine.items()) or "defaults"
        return f"prefixrag ({settings})"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> PrefixragServer:
        env = dict(os.environ)
        env.update({f"PREFIXRAG_ENGINE__{k.upper()}": str(v) for k, v in self.engine.items()})
        env["PREFIXRAG_ENGINE__DISK_CACHE_BYTES"] = "0"
        # an index of its own: the default one has a single writer (a user's server may hold it)
        env["PREFIXRAG_INDEX_DIR"] = str(self.log_path.with_suffix(".index"))
        args = [sys.executable, "-m", "rag.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*args, "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"prefixrag serve exited with {self.process.returncode}: {self.log_tail()}"
                )
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefixrag serve was not ready after {timeout_s:.0f} s: {self.log_tail()}")

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.log_path.with_suffix(".index"), ignore_errors=True)

    def info(self) -> dict[str, Any]:
        return dict(httpx.get(f"http://127.0.0.1:{self.port}/server_info", timeout=10.0).json())
