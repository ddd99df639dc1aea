"""Load: a real server (a subprocess on 127.0.0.1) under 16 concurrent clients, and over capacity.

The load test sends the same mixed round of 52 requests (questions, streamed questions, chat
completions plain and streamed, document adds) twice, 104 in all, 16 clients at a time, after sending
each distinct greedy request once sequentially, and checks:

- no 5xx and no error of any kind; every body valid against the response models the OpenAPI schema
  documents (streams: every frame);
- every greedy answer equal to the sequential one (and streamed == plain);
- the prefix cache never above its byte budget (``/v1/cache`` sampled during the run) and no node
  locked once the server is idle;
- the server's resident memory after the second identical round close to the first (no leak),
  measured once the server is idle and has handed freed heap back (the engine trims it when idle).
  Allocator noise between identical rounds measured -77..+85 MiB on a 2-core machine; the bound,
  128 MiB, is still below what keeping one request in ten alive would cost (a request's KV buffer
  alone is ~14 MiB for a 300-token RAG prompt), and round 1 grows ~240 MiB over the warm server.

Answers are comparable because the chunks a question retrieves do not change (each question has one
clearly right document; the notes added meanwhile are unrelated) and the service runs with
``chunk_order=canonical``: the default ``cache`` order lays chunks out by what the cache holds at
that moment, so under load the same question may legitimately get a differently ordered prompt.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from rag.api import Settings
from tests.api.conftest import make_engine
from tests.api.helpers import assert_error, wait_until
from tests.reliability import support
from tests.reliability.corpus import CHATS, DOCUMENTS, QUESTIONS, note

CLIENTS = 16
MAX_TOKENS = 4
CACHE_BYTES = 96 << 20
ROUND_DEADLINE_S = 300.0
RSS_GROWTH_BOUND = 128 << 20
MIX = {"ask": 16, "ask_stream": 10, "chat": 11, "chat_stream": 7, "add": 8}  # 52 a round, 104 in all


def _round_specs(seed: int = 8) -> list[tuple[str, int]]:
    specs = []
    for kind, count in MIX.items():
        n = len(QUESTIONS) if kind.startswith("ask") else len(CHATS)
        specs += [(kind, i if kind == "add" else i % n) for i in range(count)]
    random.Random(seed).shuffle(specs)
    return specs


def _send(http: httpx.Client, kind: str, i: int) -> tuple[int, Any]:
    """One request; returns its status and what it produced (answer text and sources, or ids)."""
    if kind in ("ask", "ask_stream"):
        body = {
            "question": QUESTIONS[i],
            "top_k": 1,
            "max_tokens": MAX_TOKENS,
            "stream": kind == "ask_stream",
        }
        reply = http.post("/v1/ask", json=body)
        if reply.status_code != 200:
            return reply.status_code, reply.text
        if kind == "ask":
            return 200, support.check_ask(reply.json(), MAX_TOKENS)
        return 200, support.check_ask_stream(reply.text, MAX_TOKENS)
    if kind in ("chat", "chat_stream"):
        stream = kind == "chat_stream"
        body = {"messages": CHATS[i], "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        reply = http.post("/v1/chat/completions", json=body)
        if reply.status_code != 200:
            return reply.status_code, reply.text
        if stream:
            return 200, support.check_chat_stream(reply.text, MAX_TOKENS)
        return 200, support.check_chat(reply.json(), MAX_TOKENS)
    doc = note(i)
    reply = http.post("/v1/documents", json=[doc])
    if reply.status_code != 201:
        return reply.status_code, reply.text
    support.check_added(reply.json(), [doc["id"]])
    return 201, [doc["id"]]


class CacheSampler(threading.Thread):
    """Polls ``/v1/cache`` until stopped; keeps the largest used bytes and every budget breach."""

    def __init__(self, url: str, interval: float = 0.2) -> None:
        super().__init__(name="cache-sampler", daemon=True)
        self.url, self.interval = url, interval
        self.samples = 0
        self.max_used = 0
        self.max_waiting = 0
        self.breaches: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self._halt.is_set():
                stats = http.get("/v1/cache").json()
                cache = stats["cache"]
                self.samples += 1
                self.max_used = max(self.max_used, cache["used_bytes"])
                self.max_waiting = max(self.max_waiting, stats["engine"]["waiting"])
                if cache["used_bytes"] > cache["capacity_bytes"]:
                    self.breaches.append(cache)
                self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)


def _run_round(url: str, specs: list[tuple[str, int]]) -> tuple[support.Tally, dict[tuple[str, int], set]]:
    """Send ``specs`` with CLIENTS concurrent clients; bounded by ROUND_DEADLINE_S."""
    work: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
    for spec in specs:
        work.put(spec)
    tally = support.Tally()
    outputs: dict[tuple[str, int], set] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + ROUND_DEADLINE_S

    def client() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while time.monotonic() < deadline:
                try:
                    kind, i = work.get_nowait()
                except queue.Empty:
                    return
                t0 = time.perf_counter()
                try:
                    status, produced = _send(http, kind, i)
                except (AssertionError, ValueError, httpx.HTTPError) as exc:  # invalid body, timeout...
                    with lock:
                        tally.failures.append(f"{kind} {i}: {type(exc).__name__}: {exc}"[:500])
                    continue
                with lock:
                    tally.add(status, time.perf_counter() - t0)
                    if status >= 400:
                        tally.failures.append(f"{kind} {i}: {status} {produced}"[:500])
                    elif kind != "add":
                        outputs.setdefault((kind.removesuffix("_stream"), i), set()).add(_freeze(produced))

    threads = [threading.Thread(target=client, name=f"load-client-{n}") for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=ROUND_DEADLINE_S + 130)
    assert not any(t.is_alive() for t in threads), "load clients did not stop"
    return tally, outputs


def _freeze(produced: Any) -> Any:
    return (produced[0], tuple(produced[1])) if isinstance(produced, tuple) else produced


def _idle(http: httpx.Client) -> bool:
    stats = http.get("/v1/cache").json()
    engine = stats["engine"]
    return engine["waiting"] == 0 and engine["running"] == 0 and stats["in_flight"] == 0


def _settled_rss(server: support.ServerProcess, timeout: float = 10.0) -> int:
    """The server's RSS once it stops moving (this test's server trims the heap 0.5 s after going idle)."""
    deadline = time.monotonic() + timeout
    last = server.rss()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = server.rss()
        if abs(now - last) < 1 << 20:
            return now
        last = now
    return last


@pytest.mark.slow
def test_mixed_load_twice(tmp_path):
    env = {
        "PREFIXRAG_ENGINE__CACHE_BYTES": str(CACHE_BYTES),
        # greedy answers under load equal sequential ones bit for bit: the opt-in guarantee
        "PREFIXRAG_ENGINE__BATCH_INVARIANT": "true",
        "PREFIXRAG_ENGINE__IDLE_TRIM_S": "0.5",  # RSS is read once settled: trim soon after each round
        "PREFIXRAG_RAG__CHUNK_ORDER": "canonical",
        "PREFIXRAG_RAG__MAX_TOKENS": str(MAX_TOKENS),
        "PREFIXRAG_MAX_TOKENS_LIMIT": "64",
        "PREFIXRAG_DEFAULT_MAX_TOKENS": str(MAX_TOKENS),
    }
    with (
        support.ServerProcess(tmp_path, env=env) as server,
        httpx.Client(base_url=server.url, timeout=120) as http,
    ):
        reply = http.post("/v1/documents", json=DOCUMENTS)
        assert reply.status_code == 201, reply.text

        # the reference: each distinct greedy request once, one at a time
        reference: dict[tuple[str, int], Any] = {}
        for i in range(len(QUESTIONS)):
            status, produced = _send(http, "ask", i)
            assert status == 200, produced
            assert [s.split("#")[0] for s in produced[1]] == [DOCUMENTS[i]["id"]], produced
            reference[("ask", i)] = _freeze(produced)
        for i in range(len(CHATS)):
            status, produced = _send(http, "chat", i)
            assert status == 200, produced
            reference[("chat", i)] = produced
        rss_warm = _settled_rss(server)

        specs = _round_specs()
        report = []
        rss = []
        for round_no in (1, 2):
            sampler = CacheSampler(server.url)
            sampler.start()
            t0 = time.perf_counter()
            try:
                tally, outputs = _run_round(server.url, specs)
            finally:
                sampler.stop()
            wall = time.perf_counter() - t0
            assert wait_until(lambda: _idle(http), timeout=60), http.get("/v1/cache").json()
            rss.append(_settled_rss(server))
            report.append(
                f"round {round_no}: {tally.summary()}, {wall:.1f} s wall, {sampler.samples} cache samples, "
                f"max used {sampler.max_used / 2**20:.1f} of {CACHE_BYTES / 2**20:.0f} MiB, "
                f"max queue {sampler.max_waiting}, RSS {rss[-1] / 2**20:.0f} MiB"
            )
            print(report[-1])

            assert tally.requests == len(specs) == sum(MIX.values()), tally.summary()
            assert not tally.failures, tally.failures[:5]
            assert set(tally.statuses) <= {200, 201}, tally.statuses
            assert sampler.samples >= 3 and not sampler.breaches, sampler.breaches[:3]
            mismatched = {k: v for k, v in outputs.items() if v != {reference[k]}}
            assert not mismatched, (mismatched, {k: reference[k] for k in mismatched})

            stats = http.get("/v1/cache").json()
            cache = stats["cache"]
            assert cache["protected_bytes"] == 0, cache  # every lock released (the service pins nothing)
            assert cache["used_bytes"] <= cache["capacity_bytes"] == CACHE_BYTES, cache
            assert stats["engine"]["failed"] == 0, stats

        assert http.get("/v1/documents").json()["data"].__len__() == len(DOCUMENTS) + MIX["add"]
        growth = rss[1] - rss[0]
        print(
            f"RSS: warm {rss_warm / 2**20:.0f} MiB, after round 1 {rss[0] / 2**20:.0f} MiB, "
            f"after round 2 {rss[1] / 2**20:.0f} MiB, growth over the identical round {growth / 2**20:+.1f} MiB"
        )
        assert growth < RSS_GROWTH_BOUND, f"RSS grew by {growth / 2**20:.1f} MiB over an identical round"


STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


@pytest.mark.slow
def test_over_capacity_gets_429_with_retry_after_not_timeouts(serve, loaded_model):
    """Two decode slots and three queue places against 24 clients: the excess is refused at once with
    429 and Retry-After; nothing times out; the server drains and serves again."""
    eng = make_engine(loaded_model, max_running=2, max_waiting=3)
    try:
        with serve(Settings(max_inflight=64), engine=eng) as srv:
            tally = support.Tally()
            codes: Counter[str] = Counter()
            retry_after: list[int] = []
            refused_latency: list[float] = []
            lock = threading.Lock()
            body = {"messages": STORY, "max_tokens": 8, "temperature": 0}

            def client(n: int) -> None:
                with httpx.Client(base_url=srv.url, timeout=60) as http:
                    for _ in range(3):
                        t0 = time.perf_counter()
                        try:
                            reply = http.post("/v1/chat/completions", json=body)
                        except httpx.HTTPError as exc:  # a timeout would land here
                            with lock:
                                tally.failures.append(f"client {n}: {type(exc).__name__}: {exc}")
                            continue
                        took = time.perf_counter() - t0
                        with lock:
                            tally.add(reply.status_code, took)
                            if reply.status_code == 429:
                                err = assert_error(reply, 429)
                                codes[err["code"]] += 1
                                retry_after.append(int(reply.headers["retry-after"]))
                                refused_latency.append(took)
                            elif reply.status_code == 200:
                                support.check_chat(reply.json(), 8)

            threads = [threading.Thread(target=client, args=(n,)) for n in range(24)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=240)
            assert not any(t.is_alive() for t in threads)
            print(
                f"over capacity: {tally.summary()}, 429 codes {dict(codes)}, Retry-After "
                f"{min(retry_after, default=0)}..{max(retry_after, default=0)} s, refusals answered in "
                f"p95 {support.percentile(refused_latency, 95) * 1000:.0f} ms"
            )
            assert not tally.failures, tally.failures[:5]
            assert set(tally.statuses) == {200, 429}, tally.statuses
            assert tally.statuses[429] >= 10 and codes == {"queue_full": tally.statuses[429]}
            assert all(1 <= s <= 60 for s in retry_after)
            assert support.percentile(refused_latency, 95) < 5.0  # refused at once, not after a wait
            assert wait_until(lambda: eng.stats()["waiting"] == 0 and eng.stats()["running"] == 0, 60)
            assert eng.cache.stats().protected_bytes == 0
            with httpx.Client(base_url=srv.url, timeout=60) as http:
                assert http.post("/v1/chat/completions", json=body).status_code == 200
    finally:
        eng.close()
