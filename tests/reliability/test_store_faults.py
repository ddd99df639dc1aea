"""Two HTTP replicas on one real PostgreSQL document store, under faults.

- tenancy holds across replicas exactly as on a local index: 404 across tenants, the shared
  collection read-only for tenants, listings of one's own collections only;
- a writer killed mid-transaction leaves nothing half-visible: every document is whole or absent, in
  the store and on every replica;
- PostgreSQL stopped under load: questions are answered from what the replicas hold, ``/readyz``
  says the store is unreachable, writes get 503 with Retry-After and a JSON error body; once it is
  back the replicas reconnect by themselves, and no acknowledged write is lost;
- a wrong password or an unreachable server is a startup error naming the problem.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from rag.api import Settings
from rag.api.services import build_pipeline
from tests.api.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
ALICE, BOB, ADMIN = "sk-alice-0001", "sk-bob-00001", "sk-admin-0001"
KEYS = {ALICE: "alice", BOB: "bob"}
WRITER = """
import sys
import numpy as np
from rag.config import RAGConfig
from rag.retrieval.index import VectorIndex
from rag.stores.indexes import SearchIndexes
from rag.stores.postgres import PostgresStore
from rag.stores.protocol import ChunkRecord, DocumentWrite
from rag.types import Chunk, Document

store = PostgresStore(sys.argv[1])
store.check_config(RAGConfig())
store.attach(SearchIndexes(lambda dim: VectorIndex(dim, kind="flat"), lambda: 384, lambda c: c.text))
rng = np.random.default_rng(0)
for i in range(100_000):
    doc_id = f"bulk-{i}"
    chunks = tuple(
        ChunkRecord(
            Chunk(doc_id=doc_id, chunk_id=f"bulk:{doc_id}:{j}", text=f"part {j} of {doc_id}", start=0,
                  end=1, n_tokens=3, collection="bulk"),
            rng.standard_normal((1, 384)).astype(np.float32),
        )
        for j in range(int(sys.argv[2]))
    )
    print("writing", doc_id, flush=True)
    store.write([DocumentWrite("bulk", Document(id=doc_id, text=f"bulk document {i}"), f"d{i}", chunks)])
    print("acked", doc_id, flush=True)
"""
CHUNKS_PER_BULK = 400


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def store_url(postgres) -> str:
    return str(postgres.create_database("store_faults"))


@pytest.fixture(scope="module")
def replicas(serve, engine, store_url) -> Iterator[list[Any]]:
    """Two servers (each its own pipeline, store connection and follower) on one database."""
    settings = Settings(api_keys=KEYS, admin_key=ADMIN, document_store=store_url, warm_up=False)
    pipelines = [build_pipeline(settings, engine) for _ in range(2)]
    try:
        with serve(settings, pipeline=pipelines[0]) as one, serve(settings, pipeline=pipelines[1]) as two:
            yield [httpx.Client(base_url=s.url, timeout=120) for s in (one, two)]
    finally:
        for pipeline in pipelines:
            pipeline.close()


def _waits_on_a_lock(store_url: str) -> bool:
    """Some other session is blocked on a lock (the writer, inside its transaction)."""
    with psycopg.connect(store_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).fetchone()
    return bool(row and row[0])


def _doc(http: httpx.Client, key: str, doc_id: str, collection: str | None = None) -> httpx.Response:
    where = f"?collection={collection}" if collection else ""
    return http.get(f"/v1/documents/{doc_id}{where}", headers=_auth(key))


def test_tenancy_holds_across_replicas_on_the_store(replicas):
    one, two = replicas
    alice = {"id": "plan.md", "text": "# Plan\n\nAlice ships the Zorvath release on Friday."}
    bob = {"id": "plan.md", "text": "# Plan\n\nBob ships the Quillon release on Monday."}
    assert one.post("/v1/documents", json=[alice], headers=_auth(ALICE)).status_code == 201
    assert two.post("/v1/documents", json=[bob], headers=_auth(BOB)).status_code == 201
    reply = one.post("/v1/documents?collection=shared", json=[alice], headers=_auth(ALICE))
    assert reply.status_code == 403 and reply.json()["error"]["code"] == "collection_read_only"
    handbook = {"id": "handbook.md", "text": "The Harwick ferry leaves at 7:40."}
    assert (
        two.post("/v1/documents?collection=shared", json=[handbook], headers=_auth(ADMIN)).status_code == 201
    )
    for http in (one, two):  # every replica, whichever took the write
        assert wait_until(lambda h=http: _doc(h, BOB, "handbook.md").status_code == 200, timeout=1.0)
        assert wait_until(lambda h=http: "Zorvath" in _doc(h, ALICE, "plan.md").text, timeout=1.0)
        assert "Quillon" in _doc(http, BOB, "plan.md").json()["text"]  # same id, own collection
        reply = _doc(http, BOB, "plan.md", collection="alice")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "collection_not_found"
        listed = http.get("/v1/documents", headers=_auth(BOB)).json()["data"]
        assert {(d["collection"], d["id"]) for d in listed} == {("bob", "plan.md"), ("shared", "handbook.md")}
        answer = http.post(
            "/v1/ask", json={"question": "When does Alice ship Zorvath?", "max_tokens": 1}, headers=_auth(BOB)
        ).json()
        assert {s["collection"] for s in answer["sources"]} <= {"bob", "shared"}, answer["sources"]


def test_a_writer_killed_mid_transaction_leaves_nothing_half_visible(replicas, store_url):
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, store_url, str(CHUNKS_PER_BULK)],
        env=_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(writer.stdout.readline, "")), daemon=True)
    reader.start()
    # A SHARE lock on the chunks table stops the next write after its document rows and before its
    # chunks (DELETE and COPY need ROW EXCLUSIVE): the writer is killed mid-transaction, not by luck.
    with psycopg.connect(store_url) as blocker:
        try:
            assert wait_until(
                lambda: sum(x.startswith("acked") for x in lines) >= 3 or writer.poll() is not None,
                timeout=120,
            )
            blocker.execute("LOCK TABLE prefixrag.chunks IN SHARE MODE")
            assert wait_until(lambda: _waits_on_a_lock(store_url), timeout=60), lines[-3:]
            writer.kill()  # SIGKILL, with a write in flight
        finally:
            writer.kill()
            writer.wait(30)
        blocker.rollback()  # the orphaned transaction resumes, finds its client gone and aborts
    reader.join(10)
    assert writer.returncode == -9, writer.stderr.read() if writer.stderr else ""
    acked = {x.split()[1] for x in lines if x.startswith("acked")}
    sent = {x.split()[1] for x in lines if x.startswith("writing")}
    assert sent - acked, lines[-3:]  # one was in flight
    with psycopg.connect(store_url) as conn:
        stored = dict(
            conn.execute(
                "SELECT d.doc_id, count(c.chunk_id) = cardinality(d.chunk_ids) AND cardinality(d.chunk_ids) = %s "
                "FROM prefixrag.documents d LEFT JOIN prefixrag.chunks c USING (collection, doc_id) "
                "WHERE d.collection = 'bulk' GROUP BY d.doc_id, d.chunk_ids",
                (CHUNKS_PER_BULK,),
            ).fetchall()
        )
    assert acked <= set(stored) <= sent and all(stored.values()), stored  # whole or absent
    for http in replicas:  # the replicas followed every committed write, whole

        def whole(h: httpx.Client = http) -> bool:
            listed = h.get("/v1/documents?collection=bulk", headers=_auth(ADMIN)).json()["data"]
            return {d["id"]: d["chunks"] for d in listed} == dict.fromkeys(stored, CHUNKS_PER_BULK)

        assert wait_until(whole, timeout=1.0)


def test_postgres_stopped_under_load_reads_go_on_writes_get_503_and_replicas_reconnect(replicas, postgres):
    one, two = replicas
    seed = {"id": "depot.md", "text": "The Norrland depot opens at six and closes at ten."}
    assert one.post("/v1/documents", json=[seed], headers=_auth(ALICE)).status_code == 201
    stop = threading.Event()
    asked: list[int] = []
    wrote: list[tuple[str, int]] = []  # (id, status) in order; appends are atomic across threads
    bad: list[str] = []

    def load(http: httpx.Client, n: int) -> None:
        k = 0
        while not stop.is_set():
            k += 1
            reply = http.post(
                "/v1/ask",
                json={"question": "When does the depot open?", "max_tokens": 1},
                headers=_auth(ALICE),
            )
            asked.append(reply.status_code)
            doc = {"id": f"load-{n}-{k}", "text": f"Load note {n}-{k}: shelf {k} is free."}
            reply = http.post("/v1/documents", json=[doc], headers=_auth(ALICE))
            wrote.append((doc["id"], reply.status_code))
            if reply.status_code == 503 and not (
                int(reply.headers.get("retry-after", "0")) >= 1
                and reply.json()["error"]["code"] == "store_unavailable"
                and "Traceback" not in reply.text
            ):
                bad.append(reply.text)

    threads = [threading.Thread(target=load, args=(h, n)) for n, h in enumerate(replicas)]
    for t in threads:
        t.start()
    try:
        assert wait_until(lambda: sum(s == 201 for _, s in wrote[:]) >= 4, timeout=60)
        postgres.stop_server()
        for http in replicas:
            assert wait_until(lambda h=http: not h.get("/readyz").json()["store"]["reachable"], timeout=5)
            ready = http.get("/readyz")
            assert ready.status_code == 200 and "unreachable" in ready.json()["store"]["error"]
            assert "postgres:***@" in ready.json()["store"]["location"]
            reply = http.post(
                "/v1/documents", json=[{"id": "down.md", "text": "Written while down."}], headers=_auth(ALICE)
            )
            assert reply.status_code == 503 and int(reply.headers["retry-after"]) >= 1, reply.text
            assert (
                reply.json()["error"]["code"] == "store_unavailable"
                and "unreachable" in reply.json()["error"]["message"]
            )
            assert http.delete("/v1/documents/depot.md", headers=_auth(ALICE)).status_code == 503
            answer = http.post(
                "/v1/ask",
                json={"question": "When does the depot open?", "max_tokens": 1},
                headers=_auth(ALICE),
            )
            assert answer.status_code == 200, answer.text
            assert "depot.md" in {s["doc_id"] for s in answer.json()["sources"]}
        time.sleep(1.0)  # load goes on against the stopped store
    finally:
        if not postgres.running:
            postgres.start()
    try:
        for http in replicas:
            assert wait_until(lambda h=http: h.get("/readyz").json()["store"]["reachable"], timeout=10)
        assert wait_until(lambda: wrote[-1][1] == 201, timeout=30)  # writes flow again
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not bad, bad[:2]
    assert set(asked) == {200}, sorted(set(asked))
    assert {status for _, status in wrote} == {201, 503}
    acked = {doc_id for doc_id, status in wrote if status == 201}
    for http in replicas:  # no acknowledged write lost, on either replica

        def holds(h: httpx.Client = http) -> bool:
            listed = {
                d["id"] for d in h.get("/v1/documents?collection=alice", headers=_auth(ALICE)).json()["data"]
            }
            return acked <= listed

        assert wait_until(holds, timeout=1.0)
    after = {"id": "after.md", "text": "Written after the restart through replica two."}
    assert two.post("/v1/documents", json=[after], headers=_auth(ALICE)).status_code == 201
    assert wait_until(lambda: _doc(one, ALICE, "after.md").status_code == 200, timeout=1.0)


def test_a_wrong_password_or_an_unreachable_server_is_a_startup_error(postgres, tmp_path):
    from typer.testing import CliRunner

    from rag.cli import app

    notes = tmp_path / "notes.md"
    notes.write_text("A note.")
    wrong = postgres.url("postgres", password="wrong-password")
    closed = f"postgresql://postgres:hunter22@127.0.0.1:{_closed_port()}/rag"
    serve = subprocess.run(  # a server process stops before it serves (or loads a model)
        [sys.executable, "-m", "rag.cli", "serve", "--port", "0", "--document-store", wrong],
        env=_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ingest = CliRunner().invoke(app, ["ingest", str(notes), "--document-store", closed])
    cases = [
        (serve.returncode, serve.stdout + serve.stderr, 'password authentication failed for user "postgres"'),
        (ingest.exit_code, ingest.output, "Connection refused"),
    ]
    for code, output, reason in cases:
        out = " ".join(output.split())
        assert code == 2, out
        assert reason in out and "cannot open the document store postgresql://postgres:***@" in out, out
        assert "wrong-password" not in out and "hunter22" not in out and "Traceback" not in out, out


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
