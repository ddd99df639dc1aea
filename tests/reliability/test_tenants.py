"""Tenants own their documents: two tenants and an admin on a real server over a real index.

Every operation of one tenant on the other's documents is refused or invisible (list, get, delete,
ask, chat with retrieval, upload over an existing id, search by a word only the other's text holds);
the shared collection is readable by both and writable only with the admin key; a ``collections``
value naming a collection the caller cannot read is a 404, never results. Under concurrent adds and
deletes by several tenants no document lands in the wrong collection, and after a SIGKILL mid-write
every acknowledged document is back in its own collection.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rag.api import Settings
from rag.api.services import build_pipeline
from tests.api.conftest import make_engine
from tests.api.helpers import assert_error, wait_until
from tests.reliability import support

ALICE, BOB, CAROL, ADMIN = (
    "sk-alice-tenants-001",
    "sk-bob-tenants-0002",
    "sk-carol-tenants-03",
    "sk-admin-tenants-04",
)
KEYS = {ALICE: "alice", BOB: "bob", CAROL: "carol"}
SECRET = "zq7vortex"  # a word that only alice's document holds
ALICE_DOC = {
    "id": "plan.md",
    "text": f"# Plan\n\nAlice's launch code for the Zorblax project is {SECRET}. Keep it private.",
}
BOB_DOC = {"id": "notes.md", "text": "# Notes\n\nBob's team meets on Tuesdays in the Lyon office."}
HANDBOOK = {
    "id": "handbook.md",
    "text": "# Handbook\n\nThe Harwick ferry leaves at 7:40; tickets cost 12 euros.",
}
FEW = 4  # max_tokens: every answer here is short


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def server(serve, engine, tmp_path_factory) -> Iterator[Any]:
    settings = Settings(
        api_keys=KEYS, admin_key=ADMIN, index_dir=tmp_path_factory.mktemp("tenants") / "index", warm_up=False
    )
    pipeline = build_pipeline(settings, engine)
    with serve(settings, pipeline=pipeline) as srv:
        srv.pipeline = pipeline
        http = httpx.Client(base_url=srv.url, timeout=120)
        for key, doc, where in (
            (ALICE, ALICE_DOC, ""),
            (BOB, BOB_DOC, ""),
            (ADMIN, HANDBOOK, "?collection=shared"),
        ):
            reply = http.post(f"/v1/documents{where}", json=[doc], headers=_auth(key))
            assert reply.status_code == 201, reply.text
        srv.http = http
        yield srv
        http.close()


def _get(srv: Any, key: str, path: str) -> httpx.Response:
    reply: httpx.Response = srv.http.get(path, headers=_auth(key))
    return reply


def test_listing_shows_only_the_callers_collections(server):
    def listed(key: str) -> set[tuple[str, str]]:
        reply = _get(server, key, "/v1/documents")
        assert reply.status_code == 200, reply.text
        return {(d["id"], d["collection"]) for d in reply.json()["data"]}

    assert listed(ALICE) == {("plan.md", "alice"), ("handbook.md", "shared")}
    assert listed(BOB) == {("notes.md", "bob"), ("handbook.md", "shared")}
    assert listed(CAROL) == {("handbook.md", "shared")}
    assert listed(ADMIN) >= {("plan.md", "alice"), ("notes.md", "bob"), ("handbook.md", "shared")}
    assert_error(_get(server, BOB, "/v1/documents?collection=alice"), 404, code="collection_not_found")
    collections = _get(server, BOB, "/v1/collections").json()["data"]
    assert [(c["name"], c["writable"], c["home"]) for c in collections] == [
        ("bob", True, True),
        ("shared", False, False),
    ]


def test_another_tenants_id_answers_exactly_as_an_unknown_id(server, monkeypatch):
    visited: list[str] = []
    real = server.pipeline.get_document

    def spy(doc_id: str, collection: str = "default") -> Any:
        visited.append(collection)
        return real(doc_id, collection=collection)

    monkeypatch.setattr(server.pipeline, "get_document", spy)
    theirs = _get(server, BOB, "/v1/documents/plan.md")  # alice has one; bob does not
    work_theirs = list(visited)
    visited.clear()
    unknown = _get(server, BOB, "/v1/documents/plan.md?collection=bob")
    assert (theirs.status_code, theirs.json()) == (unknown.status_code, unknown.json())
    assert_error(theirs, 404, code="document_not_found")
    nobody = _get(server, BOB, "/v1/documents/never-stored.md")
    assert nobody.json()["error"] == {
        **theirs.json()["error"],
        "message": "no document with id 'never-stored.md'",
    }
    assert work_theirs == ["bob", "shared"]  # only bob's collections are ever looked at
    visited.clear()
    _get(server, BOB, "/v1/documents/never-stored.md")
    assert visited == work_theirs  # the same work whether another tenant holds the id or not
    for key in (ALICE, ADMIN):  # the owner (and the admin) do see it
        reply = _get(server, key, "/v1/documents/plan.md?collection=alice")
        assert reply.status_code == 200 and SECRET in reply.json()["text"], reply.text
    named = _get(server, BOB, "/v1/documents/plan.md?collection=alice")
    missing = _get(server, BOB, "/v1/documents/plan.md?collection=nobody")
    assert_error(named, 404, code="collection_not_found")
    assert named.json()["error"]["message"].replace("alice", "X") == missing.json()["error"][
        "message"
    ].replace("nobody", "X")


def test_writes_stay_in_the_callers_own_collection(server):
    http = server.http
    # delete: bob cannot reach alice's document, by default or by naming her collection
    assert_error(http.delete("/v1/documents/plan.md", headers=_auth(BOB)), 404, code="document_not_found")
    assert_error(
        http.delete("/v1/documents/plan.md?collection=alice", headers=_auth(BOB)),
        404,
        code="collection_not_found",
    )
    # upload over an existing id: bob gets his own document; alice's is untouched
    mine = {"id": "plan.md", "text": "# Plan\n\nBob's plan: paint the boat shed green."}
    added = http.post("/v1/documents", json=[mine], headers=_auth(BOB))
    assert added.status_code == 201 and added.json()["collection"] == "bob", added.text
    assert_error(http.post("/v1/documents?collection=alice", json=[mine], headers=_auth(BOB)), 404)
    assert SECRET in _get(server, ALICE, "/v1/documents/plan.md").json()["text"]
    assert _get(server, BOB, "/v1/documents/plan.md").json()["text"] == mine["text"]
    upload = http.post(
        "/v1/documents",
        files=[("file", ("plan.md", b"Bob's uploaded plan.", "text/markdown"))],
        headers=_auth(BOB),
    )
    assert upload.status_code == 201 and upload.json()["collection"] == "bob", upload.text
    assert SECRET in _get(server, ALICE, "/v1/documents/plan.md").json()["text"]
    # the shared collection: both read, only the admin writes
    for key in (ALICE, BOB):
        assert _get(server, key, "/v1/documents/handbook.md").json()["collection"] == "shared"
        assert_error(
            http.post("/v1/documents?collection=shared", json=[HANDBOOK], headers=_auth(key)),
            403,
            code="collection_read_only",
        )
        assert_error(
            http.delete("/v1/documents/handbook.md?collection=shared", headers=_auth(key)),
            403,
            code="collection_read_only",
        )
    extra = {"id": "timetable.md", "text": "# Timetable\n\nThe Harwick ferry's last crossing is at 21:10."}
    assert http.post("/v1/documents?collection=shared", json=[extra], headers=_auth(ADMIN)).status_code == 201
    assert _get(server, CAROL, "/v1/documents/timetable.md").json()["collection"] == "shared"
    assert (
        http.delete("/v1/documents/timetable.md?collection=shared", headers=_auth(ADMIN)).status_code == 200
    )
    assert http.delete("/v1/documents/plan.md", headers=_auth(BOB)).json()["collection"] == "bob"
    assert SECRET in _get(server, ALICE, "/v1/documents/plan.md").json()["text"]


def _ask(server: Any, key: str, question: str, **extra: Any) -> httpx.Response:
    reply: httpx.Response = server.http.post(
        "/v1/ask", json={"question": question, "max_tokens": FEW, "top_k": 4, **extra}, headers=_auth(key)
    )
    return reply


def _chat(server: Any, key: str, question: str, **extra: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": FEW, "temperature": 0, **extra}
    reply: httpx.Response = server.http.post("/v1/chat/completions", json=body, headers=_auth(key))
    return reply


def test_retrieval_never_reaches_another_tenants_text(server):
    question = f"What is the Zorblax launch code {SECRET}?"  # alice's own words, her unique keyword
    own = _ask(server, ALICE, question)
    assert own.status_code == 200 and ("plan.md", "alice") in {
        (s["doc_id"], s["collection"]) for s in own.json()["sources"]
    }  # the control: retrieval does find it for its owner
    answers = [_ask(server, BOB, question), _ask(server, BOB, question, stream=True)]
    answers += [_chat(server, BOB, question, rag=True), _chat(server, BOB, question, rag=True, stream=True)]
    for reply in answers:
        assert reply.status_code == 200, reply.text
        assert SECRET not in reply.text  # neither in the sources nor in the answer
    sources = answers[0].json()["sources"] + answers[2].json()["sources"]
    assert sources and {s["collection"] for s in sources} <= {"bob", "shared"}
    stream = support.sse_frames(answers[3].text)
    assert "sources" in stream[0][1] and SECRET not in stream[0][1]
    chat = _chat(server, ALICE, question, rag=True).json()
    assert any(SECRET in s["text"] for s in chat["sources"])  # chat retrieval works for the owner


def test_naming_an_unreadable_collection_is_a_404_never_results(server):
    question = f"What is the launch code {SECRET}?"
    for collections in (["alice"], ["bob", "alice"], ["no-such-collection"]):
        assert_error(_ask(server, BOB, question, collections=collections), 404, code="collection_not_found")
        assert_error(_ask(server, BOB, question, collections=collections, stream=True), 404)
        assert_error(_chat(server, BOB, question, collections=collections), 404, code="collection_not_found")
    assert_error(_ask(server, BOB, question, collections=["../alice"]), 422)
    narrowed = _ask(server, BOB, "When does the Harwick ferry leave?", collections=["shared"])
    assert narrowed.status_code == 200 and {s["collection"] for s in narrowed.json()["sources"]} == {"shared"}
    schema = server.http.get("/openapi.json").json()
    responses = schema["paths"]["/v1/ask"]["post"]["responses"]
    assert "404" in responses and "collection" in responses["404"]["description"]


def test_settings_refuse_ambiguous_collections():
    with pytest.raises(ValueError, match="tenant's name"):
        Settings(api_keys={ALICE: "shared"})
    with pytest.raises(ValueError, match="no API key maps to"):
        Settings(api_keys=KEYS, tenant_collections={"mallory": {"read": ["shared"]}})
    with pytest.raises(ValueError, match="only name the shared collection"):
        Settings(api_keys=KEYS, rag={"public_collections": ["alice"]})
    custom = Settings(api_keys=KEYS, tenant_collections={"carol": {"read": ["alice"], "write": []}})
    from rag.api.access import access_for
    from rag.api.auth import Principal

    access = access_for(Principal("carol"), custom)
    assert access.can_read("alice") and not access.can_write("alice") and access.home is None


# ---- concurrent writers of several tenants ---------------------------------------------------------


def _tenant_doc(tenant: str, k: int) -> dict[str, Any]:
    """Ids repeat across tenants on purpose: each tenant's doc-007 is its own."""
    return {"id": f"doc-{k:03d}", "text": f"# Entry {k}\n\nOwner: {tenant}. Ledger entry {k} of {tenant}."}


@pytest.mark.slow
def test_concurrent_adds_and_deletes_never_cross_collections(server):
    tenants = {ALICE: "alice", BOB: "bob", CAROL: "carol"}
    expected: dict[str, set[str]] = {name: set() for name in tenants.values()}
    errors: list[str] = []

    def writer(key: str, tenant: str, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=server.url, timeout=120, headers=_auth(key)) as http:
            for k in range(10):
                reply = http.post("/v1/documents", json=[_tenant_doc(tenant, k)])
                if reply.status_code != 201 or reply.json()["collection"] != tenant:
                    errors.append(f"{tenant} add {k}: {reply.status_code} {reply.text[:200]}")
                    return
                expected[tenant].add(f"doc-{k:03d}")
                if rng.random() < 0.4:
                    victim = f"doc-{rng.randrange(k + 1):03d}"
                    gone = http.delete(f"/v1/documents/{victim}")
                    if gone.status_code == 200:
                        expected[tenant].discard(victim)
                    elif gone.status_code != 404 or victim in expected[tenant]:
                        errors.append(f"{tenant} delete {victim}: {gone.status_code} {gone.text[:200]}")

    def asker(stop: threading.Event) -> None:  # load: questions while the writers write
        with httpx.Client(base_url=server.url, timeout=120, headers=_auth(BOB)) as http:
            while not stop.is_set():
                reply = http.post("/v1/ask", json={"question": "Whose ledger entry is 3?", "max_tokens": 1})
                if reply.status_code != 200 or any(
                    s["collection"] not in ("bob", "shared") for s in reply.json()["sources"]
                ):
                    errors.append(f"ask: {reply.status_code} {reply.text[:200]}")

    stop = threading.Event()
    threads = [
        threading.Thread(target=writer, args=(key, name, i)) for i, (key, name) in enumerate(tenants.items())
    ]
    threads.append(threading.Thread(target=asker, args=(stop,)))
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads[:-1]:
        t.join(timeout=600)
    stop.set()
    threads[-1].join(timeout=120)
    assert not any(t.is_alive() for t in threads) and not errors, errors[:5]
    print(f"3 tenants x 10 adds (+deletes) under load in {time.perf_counter() - t0:.1f} s")
    for key, tenant in tenants.items():
        listed = _get(server, key, f"/v1/documents?collection={tenant}").json()["data"]
        assert {d["id"] for d in listed if d["id"].startswith("doc-")} == expected[tenant], tenant
        for doc_id in expected[tenant]:
            text = _get(server, key, f"/v1/documents/{doc_id}?collection={tenant}").json()["text"]
            assert f"Owner: {tenant}." in text, (tenant, doc_id, text)
    everything = _get(server, ADMIN, "/v1/documents").json()["data"]
    for doc in everything:
        if doc["id"].startswith("doc-"):
            text = _get(server, ADMIN, f"/v1/documents/{doc['id']}?collection={doc['collection']}").json()[
                "text"
            ]
            assert f"Owner: {doc['collection']}." in text, doc


# ---- SIGKILL mid-write ------------------------------------------------------------------------------


class TenantWriters:
    """One thread per tenant posting its documents until the server goes away."""

    def __init__(self, url: str, keys: dict[str, str]) -> None:
        self.url, self.keys = url, keys
        self.acked: dict[str, dict[str, str]] = {tenant: {} for tenant in keys.values()}  # answered 201
        self.sent: dict[str, dict[str, str]] = {tenant: {} for tenant in keys.values()}
        self.in_flight = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(k, t), daemon=True) for k, t in keys.items()
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "writers did not stop"

    def _run(self, key: str, tenant: str) -> None:
        with httpx.Client(base_url=self.url, timeout=60, headers=_auth(key)) as http:
            for k in range(200):  # bounded; the kill ends it much sooner
                doc = _tenant_doc(tenant, k)
                with self._lock:
                    self.sent[tenant][doc["id"]] = doc["text"]
                    self.in_flight += 1
                try:
                    reply = http.post("/v1/documents", json=[doc])
                except httpx.TransportError:
                    return  # the server is gone: never acknowledged
                finally:
                    with self._lock:
                        self.in_flight -= 1
                if reply.status_code != 201 or reply.json()["collection"] != tenant:
                    self.errors.append(f"{tenant}: {reply.status_code} {reply.text[:200]}")
                    return
                with self._lock:
                    self.acked[tenant][doc["id"]] = doc["text"]

    @property
    def total_acked(self) -> int:
        return sum(len(docs) for docs in self.acked.values())


@pytest.mark.slow
def test_sigkill_mid_write_keeps_every_acknowledged_document_in_its_own_collection(tmp_path, serve, engine):
    index = tmp_path / "index"
    env = {
        "PREFIXRAG_ENGINE__CACHE_BYTES": str(16 << 20),
        "PREFIXRAG_API_KEYS": json.dumps(KEYS),
        "PREFIXRAG_ADMIN_KEY": ADMIN,
    }
    with support.ServerProcess(tmp_path, env=env, index=index) as proc:
        writers = TenantWriters(proc.url, {ALICE: "alice", BOB: "bob", CAROL: "carol"})
        writers.start()
        assert wait_until(lambda: writers.total_acked >= 12 or bool(writers.errors), timeout=240)
        assert not writers.errors, writers.errors
        time.sleep(random.Random(2).uniform(0.05, 0.3))
        assert writers.in_flight >= 1  # the kill lands mid-write
        proc.kill()
        writers.join()

    settings = Settings(api_keys=KEYS, admin_key=ADMIN, index_dir=index, warm_up=False)
    pipeline = build_pipeline(settings, engine)
    with serve(settings, pipeline=pipeline) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        for key, tenant in KEYS.items():
            listed = http.get("/v1/documents", headers=_auth(key)).json()["data"]
            mine = {d["id"] for d in listed if d["collection"] == tenant}
            assert {d["collection"] for d in listed} <= {tenant, "shared"}, listed
            assert set(writers.acked[tenant]) <= mine, sorted(set(writers.acked[tenant]) - mine)
            assert mine <= set(writers.sent[tenant]), sorted(mine - set(writers.sent[tenant]))
            for doc_id in mine:
                doc = http.get(f"/v1/documents/{doc_id}?collection={tenant}", headers=_auth(key)).json()
                assert doc["text"] == writers.sent[tenant][doc_id] and f"Owner: {tenant}." in doc["text"]
        print(
            "SIGKILL mid-write: acknowledged per tenant "
            + ", ".join(f"{t} {len(d)}" for t, d in writers.acked.items())
            + "; all back in their own collections after the restart"
        )


@pytest.mark.parametrize("public", [False, True])
def test_tenants_share_the_public_prefix_only_when_the_operator_turns_it_on(
    serve, loaded_model, tmp_path, public
):
    question = {"question": "When does the Harwick ferry leave?", "max_tokens": 2, "collections": ["shared"]}

    def cached(srv: Any, key: str) -> int:
        reply = httpx.post(srv.url + "/v1/ask", json=question, headers=_auth(key), timeout=120)
        assert reply.status_code == 200, reply.text
        return int(reply.json()["usage"]["cached_tokens"])

    settings = Settings(
        api_keys=KEYS,
        admin_key=ADMIN,
        index_dir=tmp_path / "index",
        warm_up=False,
        public_prefix_cache=public,
    )
    engine = make_engine(loaded_model)  # its own cache: nothing else warms it
    pipeline = build_pipeline(settings, engine)
    assert pipeline.config.public_collections == (["shared"] if public else [])
    try:
        with serve(settings, pipeline=pipeline) as srv:
            added = httpx.post(
                srv.url + "/v1/documents?collection=shared", json=[HANDBOOK], headers=_auth(ADMIN)
            )
            assert added.status_code == 201, added.text
            assert cached(srv, CAROL) == 0
            first = cached(srv, ALICE)  # the very prompt carol's request just cached, in alice's namespace
            if not public:
                assert first == 0  # the default: tenants' caches stay separate
            else:  # the system prompt and the shared chunk, never carol's question
                assert 0 < first < cached(srv, ALICE)  # alice's own repeat reuses more
    finally:
        engine.close()
