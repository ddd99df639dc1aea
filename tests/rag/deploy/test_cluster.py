"""Two `prefixrag serve` replicas behind sglang-router, started and stopped by these tests (127.0.0.1),
sharing one PostgreSQL document store.

Which replica served a request is read from the replicas' own counters (``GET /v1/cache``): requests
here run one at a time, so exactly one replica's count moves per request.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("sglang_router", reason="needs sglang-router (in the dev extra)")
openai = pytest.importorskip("openai")

from engine import RemoteEngine, SamplingParams  # noqa: E402
from rag.deploy.cluster import Cluster, ManagedProcess, Replica, Router  # noqa: E402
from tests.rag.stores.test_replicas import FOLLOW_S  # noqa: E402

MODEL = "smollm2-135m-instruct"
# distinct long system prompts: the shared prefixes the router should keep on one replica each
TOPICS = ["lists", "dictionaries", "generators", "decorators"]


def system_prompt(topic: str) -> str:
    return (
        f"You are a concise tutor on Python {topic}. " + f"Answer questions about {topic} in one line. " * 12
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, postgres: Any) -> Iterator[Cluster]:
    log_dir = tmp_path_factory.mktemp("cluster-logs")
    store = postgres.create_database("cluster")
    c = Cluster(
        2, "cache_aware", threads_per_replica=1, log_dir=log_dir, startup_timeout_s=150, document_store=store
    )
    with c:
        yield c
    processes = [c.router.process, *(r.process for r in c.replicas)]
    assert not any(p.alive for p in processes)
    for p in processes:
        assert p.pid is not None and not _group_alive(p.pid), f"{p.name} left processes behind"


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Any:
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def served_counts(cluster: Cluster) -> list[int]:
    return [int(s["engine"]["requests"]) for s in cluster.cache_stats()]


def which_replica(cluster: Cluster, before: list[int]) -> int:
    after = served_counts(cluster)
    moved = [i for i, (a, b) in enumerate(zip(after, before)) if a != b]
    assert len(moved) == 1, (before, after)
    return moved[0]


def _group_alive(pgid: int, settle_s: float = 3.0) -> bool:
    """Whether any live (not zombie) process is in group ``pgid``, after up to ``settle_s``."""
    deadline = time.monotonic() + settle_s
    while _group_members(pgid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)
    return False


def _group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state ppid pgrp ...
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def test_the_router_sees_both_replicas_and_the_model(cluster: Cluster) -> None:
    workers = httpx.get(cluster.url + "/workers").json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(cluster.worker_urls)
    assert all(w["is_healthy"] and w["model_id"] == MODEL for w in workers)  # from /model_info
    models = httpx.get(cluster.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_openai_client_through_the_router(client: Any) -> None:
    messages = [{"role": "user", "content": "Name one Python keyword."}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    assert reply.choices[0].message.content and reply.usage.prompt_tokens > 0
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content  # greedy: the same answer, streamed
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_cache_aware_sends_repeated_prefixes_to_the_replica_that_cached_them(
    cluster: Cluster, client: Any
) -> None:
    """New prefixes arriving together spread by load; every later request with a prefix goes to the
    replica that cached it and reuses the cached prompt."""

    def ask(topic: str, question: str) -> Any:
        messages = [
            {"role": "system", "content": system_prompt(topic)},
            {"role": "user", "content": question},
        ]
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=2,
                stream=True,  # the router counts a stream as load while it runs
                stream_options={"include_usage": True},
            )
        )
        return chunks[-1].usage

    with ThreadPoolExecutor(len(TOPICS)) as pool:  # first sight of each prefix, concurrently
        list(pool.map(lambda t: ask(t, "What is it?"), TOPICS))
    home: dict[str, set[int]] = {t: set() for t in TOPICS}
    for question in ["Give an example.", "When should I use it?"]:
        for topic in TOPICS:
            before = served_counts(cluster)
            usage = ask(topic, question)
            home[topic].add(which_replica(cluster, before))
            assert usage.prompt_tokens_details.cached_tokens > 0.6 * usage.prompt_tokens, (topic, usage)
    assert all(len(replicas) == 1 for replicas in home.values()), home  # one home per prefix
    assert set().union(*home.values()) == {0, 1}, home  # and the prefixes spread over both replicas


def test_round_robin_ignores_prefixes(cluster: Cluster) -> None:
    """A second router, round_robin, over the same replicas: identical requests alternate."""
    with Router(cluster.worker_urls, "round_robin", log_dir=cluster.log_dir, name="rr-router") as rr:
        rr_client = openai.OpenAI(base_url=rr.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "system", "content": system_prompt("sets")}, {"role": "user", "content": "Hi"}]
        served = []
        for _ in range(4):
            before = served_counts(cluster)
            rr_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
            served.append(which_replica(cluster, before))
    assert sorted(served) == [0, 0, 1, 1] and served[0] != served[1]
    assert not rr.process.alive


def test_remote_engine_through_the_router(cluster: Cluster) -> None:
    """Token-id prompts are refused by the router (422), so RemoteEngine falls back to text, which is
    also what cache_aware routing matches on; the repeat lands where its prefix is cached."""
    with RemoteEngine(cluster.url, MODEL) as eng:
        prompt = eng.encode(
            [{"role": "system", "content": system_prompt("strings")}, {"role": "user", "content": "Why?"}]
        )
        first = eng.generate(prompt, SamplingParams(max_tokens=4), namespace="team-a")
        assert eng.prompt_format == "text"
        again = eng.generate(prompt, SamplingParams(max_tokens=4), namespace="team-a")
        other = eng.generate(prompt, SamplingParams(max_tokens=4), namespace="team-b")
        streamed = list(eng.stream(prompt, SamplingParams(max_tokens=4), namespace="team-a"))
    assert first.text and first.text == again.text and first.prompt_tokens == len(prompt)
    assert first.cached_tokens == 0 and again.cached_tokens == len(prompt)  # its logits saved too
    assert other.cached_tokens == 0  # cache_salt reaches the replica on /v1/completions
    assert streamed[-1].result is not None and streamed[-1].result.text == first.text


def test_replicas_on_one_store_serve_each_others_writes(cluster: Cluster) -> None:
    """A document added through one replica: listed and served by the other soon after; a delete
    through the other: gone from the first soon after (FOLLOW_S: a liveness bound)."""
    first, second = cluster.worker_urls
    doc = {"id": "kestrel.md", "text": "The Kestrel lab wifi password is bluefinch22."}
    assert httpx.post(first + "/v1/documents", json=[doc], timeout=120).status_code == 201
    t0 = time.monotonic()
    while httpx.get(second + "/v1/documents/kestrel.md", timeout=10).status_code != 200:
        assert time.monotonic() - t0 < FOLLOW_S, (
            f"the other replica did not serve the write within {FOLLOW_S} s"
        )
        time.sleep(0.02)
    assert httpx.get(second + "/v1/documents/kestrel.md").json()["text"] == doc["text"]
    assert httpx.delete(second + "/v1/documents/kestrel.md", timeout=60).status_code == 200
    t0 = time.monotonic()
    while httpx.get(first + "/v1/documents/kestrel.md", timeout=10).status_code != 404:
        assert time.monotonic() - t0 < FOLLOW_S, (
            f"the delete did not reach the first replica within {FOLLOW_S} s"
        )
        time.sleep(0.02)
    for url in cluster.worker_urls:
        store = httpx.get(url + "/readyz").json()["store"]
        assert store["backend"] == "postgresql" and store["reachable"], store


def test_request_id_reaches_the_replica(cluster: Cluster) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 1}
    reply = httpx.post(cluster.url + "/v1/completions", json=body, headers={"X-Request-Id": "trace-42"})
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "trace-42"


def test_sigterm_lets_the_in_flight_stream_finish(tmp_path: Path) -> None:
    """Graceful shutdown: the listener closes at once, the running stream completes, then the process
    exits (uvicorn re-raises the signal after its shutdown, so the status says SIGTERM)."""
    replica = Replica(log_dir=tmp_path, threads=1, shutdown_timeout_s=60, name="draining")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to fifty in words, one per line."}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
    }
    lines: list[str] = []
    with replica:
        with httpx.stream("POST", replica.url + "/v1/chat/completions", json=body, timeout=120) as reply:
            for line in reply.iter_lines():
                lines.append(line)
                if len(lines) == 3:  # a frame or two in: stop the server mid-stream
                    replica.process.signal(signal.SIGTERM)
                    time.sleep(0.5)
                    with pytest.raises(httpx.ConnectError):
                        httpx.get(replica.url + "/health", timeout=5)  # no new connections
        assert replica.process.wait(30) and replica.process.returncode in (0, -signal.SIGTERM)
    frames = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert [x for x in lines if x][-1] == "data: [DONE]"
    assert frames[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    texts = [f["choices"][0]["delta"].get("content") for f in frames if f["choices"]]
    assert sum(1 for t in texts if t) >= 10, texts


def test_managed_process_stops_its_whole_group(tmp_path: Path) -> None:
    script = "sleep 300 & sleep 300 & wait"  # a shell with two children that ignore nothing
    proc = ManagedProcess("group", ["bash", "-c", script], log_path=tmp_path / "g.log").start()
    time.sleep(0.3)
    assert proc.pid is not None and len(_group_members(proc.pid)) == 3
    proc.stop(grace_s=5)
    assert not proc.alive and not _group_alive(proc.pid)


def test_cluster_validates_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="replicas"):
        Cluster(0)
    with pytest.raises(ValueError, match="policy"):
        Cluster(1, "fastest")  # type: ignore[arg-type]


def test_the_example_recipe_starts_and_stops_everything(tmp_path: Path) -> None:
    """examples/cluster.py: one replica + router on a private PostgreSQL, the URLs printed, SIGINT
    stops all within the grace (the private server too)."""
    import psycopg

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, str(root / "examples" / "cluster.py"), "--replicas", "1", "--threads", "1"]
    argv += ["--log-dir", str(tmp_path), "--private-postgres"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        printed: list[str] = []
        url = _read_router_url(proc, timeout_s=150, printed=printed)
        store = next(line.split()[2] for line in printed if line.startswith("private PostgreSQL: "))
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == MODEL
        replica = httpx.get(url + "/workers").json()["workers"][0]["url"]
        assert httpx.get(replica + "/readyz").json()["store"]["reachable"]
        pids = _children(proc.pid)
        assert len(pids) == 2  # the replica and the router
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not any(_group_alive(p) for p in pids)
        with pytest.raises(psycopg.OperationalError):  # the private server is gone with it
            psycopg.connect(store, connect_timeout=3)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _read_router_url(proc: subprocess.Popen[str], timeout_s: float, printed: list[str] | None = None) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        if printed is not None:
            printed.append(line)
        if line.startswith("router ready: "):
            return line.split()[2]
        assert time.monotonic() < deadline, "the recipe did not print the router URL in time"
    raise AssertionError(f"the recipe exited ({proc.wait()}) before printing the router URL")


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found
