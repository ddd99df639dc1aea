"""/v1/ask and /v1/documents on a live server over the real Pipeline (engine, embedder, index)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from rag.api import Settings
from rag.api.deps import ANONYMOUS
from tests.api.helpers import assert_error, wait_until

DOCS = [
    {
        "id": "zorblax.md",
        "text": "# Zorblax\n\nThe Zorblax project started in 2019 in Lyon. Its secret code is 4417.",
        "metadata": {"team": "research"},
    },
    {
        "id": "team.md",
        "text": "# Team\n\nThe Zorblax team has nine members. It is led by Ada Brennan and meets every Tuesday.",
    },
    {"id": "bakery.md", "text": "# Bakery\n\nThe bakery on Rue Mercière opens at seven and sells brioche."},
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("index")


@pytest.fixture(scope="module")
def settings(index_dir) -> Settings:
    return Settings(index_dir=index_dir, max_body_bytes=256 * 1024, max_question_chars=500, max_top_k=8)


@pytest.fixture(scope="module")
def pipeline(settings, engine):
    from rag.api.services import build_pipeline

    return build_pipeline(settings, engine)


@pytest.fixture(scope="module")
def server(serve, settings, pipeline):
    with serve(settings, pipeline=pipeline) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def _ask(http, question: str, **extra) -> dict:
    reply = http.post("/v1/ask", json={"question": question, "max_tokens": 16, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _sse(reply: httpx.Response) -> list[tuple[str, dict]]:
    events = []
    for frame in reply.text.split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_empty_index_still_answers(http):
    answer = _ask(http, "What is the capital of France?")
    assert answer["object"] == "answer" and answer["sources"] == []
    assert answer["text"].strip()
    assert answer["usage"]["prompt_tokens"] > 0
    t = answer["timings"]  # every timing the pipeline measures (Pipeline.ask's Timings)
    assert set(t) == {"retrieve_ms", "rerank_ms", "assemble_ms", "prefill_ms", "ttft_ms", "total_ms"}
    assert t["assemble_ms"] > 0 and t["ttft_ms"] >= t["prefill_ms"] > 0 and t["total_ms"] >= t["ttft_ms"]


def test_add_list_get_documents(http):
    reply = http.post("/v1/documents", json=DOCS)
    assert reply.status_code == 201, reply.text
    assert reply.json()["ids"] == [d["id"] for d in DOCS]
    listed = http.get("/v1/documents").json()["data"]
    assert {d["id"] for d in listed} >= {d["id"] for d in DOCS}
    doc = http.get("/v1/documents/zorblax.md").json()
    assert doc["text"] == DOCS[0]["text"] and doc["metadata"]["team"] == "research"
    assert doc["chunks"] >= 1
    wrapped = http.post("/v1/documents", json={"documents": [{"text": "An id-less note about brioche."}]})
    assert wrapped.status_code == 201 and wrapped.json()["ids"][0].startswith("doc-")


def test_ask_uses_sources_and_the_cache(http):
    first = _ask(http, "What is the secret code of the Zorblax project?", top_k=2)
    assert "zorblax.md" in {s["doc_id"] for s in first["sources"]}
    assert set(first["sources"][0]) == {"doc_id", "chunk_id", "score", "text", "collection"}
    assert first["sources"][0]["collection"] == "default"  # single-user mode: the default collection
    assert len(first["sources"]) <= 2
    again = _ask(http, "What is the secret code of the Zorblax project?", top_k=2)
    assert again["usage"]["cached_tokens"] > 0
    assert again["text"] == first["text"]
    assert (
        again["usage"]["total_tokens"]
        == again["usage"]["prompt_tokens"] + again["usage"]["completion_tokens"]
    )


def test_warm_then_ask_in_chunks_mode(http):
    assert_error(http.get("/v1/cache/warm/chunks"), 404, code="no_warm_job")
    started = http.post("/v1/cache/warm/chunks")
    assert started.status_code == 202, started.text
    assert started.json()["object"] == "cache.warm.chunks"
    assert wait_until(lambda: http.get("/v1/cache/warm/chunks").json()["state"] != "running", timeout=300)
    status = http.get("/v1/cache/warm/chunks").json()
    report = status["report"]
    assert status["state"] == "done" and status["done"] == status["total"] == report["chunks"] > 0
    assert report["warmed"] + report["already_cached"] == report["chunks"] and report["not_fitted"] == 0
    answer = _ask(
        http, "Who leads the Zorblax team, and what is the project's code?", top_k=3, reuse="chunks"
    )
    usage = answer["usage"]
    assert usage["reuse"] == "chunks" and usage["stitched_tokens"] > 0 and usage["recomputed_tokens"] > 0
    assert 0 < usage["stitch_deviation"] < 1  # the engine's estimate of how far it was from exact
    exact = _ask(http, "Who leads the Zorblax team, and what is the project's code?", top_k=3, reuse="prefix")
    assert exact["usage"]["reuse"] == "prefix" and exact["usage"]["stitched_tokens"] == 0
    assert exact["usage"]["stitch_deviation"] is None
    metrics = http.get("/metrics").text
    assert 'prefixrag_stitched_prompt_tokens_total{endpoint="ask"}' in metrics
    assert "prefixrag_chunk_reuse_stitched_tokens_total" in metrics
    assert http.get("/v1/cache").json()["engine"]["stitched_tokens"] >= usage["stitched_tokens"]
    assert http.delete("/v1/cache/warm/chunks").json()["state"] == "done"
    assert_error(http.post("/v1/ask", json={"question": "Who?", "reuse": "sideways"}), 422)


def test_ask_with_max_tokens_answers_as_pipeline_ask_does(http, pipeline):
    """Given max_tokens, /v1/ask keeps the pipeline's other sampling settings (its repetition penalty
    among them): the API and Pipeline.ask give the same answer to the same question."""
    question = "Who leads the Zorblax team and when do they meet?"
    over_http = _ask(http, question, max_tokens=40)
    params = pipeline.config.sampling_params(max_tokens=40)
    direct = pipeline.ask(question, params=params, namespace=ANONYMOUS)  # the API's tenant: same prompt
    assert direct.usage.prompt_tokens == over_http["usage"]["prompt_tokens"]
    assert over_http["text"] == direct.text
    without_penalty = replace(params, repetition_penalty=1.0)  # what the API used to generate with
    assert pipeline.ask(question, params=without_penalty, namespace=ANONYMOUS).text != direct.text


def test_ask_stream_event_order(http):
    reply = http.post("/v1/ask", json={"question": "Who leads the team?", "stream": True, "max_tokens": 12})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = _sse(reply)
    kinds = [k for k, _ in events]
    assert kinds[0] == "sources" and kinds[-3:] == ["usage", "timings", "done"]
    assert set(kinds[1:-3]) == {"delta"}
    text = "".join(d["text"] for k, d in events if k == "delta")
    plain = _ask(http, "Who leads the team?", max_tokens=12)
    assert text == plain["text"]
    usage, timings, done = (d for _, d in events[-3:])
    assert usage["prompt_tokens"] == plain["usage"]["prompt_tokens"] and usage["completion_tokens"] > 0
    assert set(timings) == set(plain["timings"]) and timings["ttft_ms"] >= timings["prefill_ms"] > 0
    assert done["finish_reason"] == plain["finish_reason"] and done["id"].startswith("ans-")


def test_rag_chat_reads_the_prompt_ask_reads_and_scores_its_sources_alike(http, pipeline):
    """A chat with "rag" is grounded by the pipeline's assembler: a one-message chat reads exactly the
    prompt /v1/ask reads for its question (so it finds it cached), with the same sources in the same
    order, each scored as the schema documents on both routes: the question-chunk cosine similarity."""
    question = "What is the secret code of the Zorblax project?"
    ask = _ask(http, question, max_tokens=8)
    body = {
        "messages": [{"role": "user", "content": question}],
        "rag": True,
        "max_tokens": 8,
        "temperature": 0,
    }
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    chat = reply.json()
    assert [s["chunk_id"] for s in chat["sources"]] == [s["chunk_id"] for s in ask["sources"]]
    assert [s["score"] for s in chat["sources"]] == [s["score"] for s in ask["sources"]]
    usage = chat["usage"]
    assert usage["prompt_tokens"] == ask["usage"]["prompt_tokens"]
    assert (
        usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
    )  # ask's prompt, its logits
    ids = [s["chunk_id"] for s in chat["sources"]]
    cosine = pipeline.kb.similarity(question, ids)
    assert [s["score"] for s in chat["sources"]] == pytest.approx([cosine[i] for i in ids])
    fused = {h.chunk_id: h.score for h in pipeline.retrieve(question)}  # not the retrieval's fused score
    assert any(abs(fused[i] - cosine[i]) > 1e-3 for i in ids if i in fused)
    streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
    first = json.loads(streamed.text.split("\n\n")[0].removeprefix("data: "))
    assert [s["score"] for s in first["sources"]] == [s["score"] for s in chat["sources"]]


def test_upload_files(http, index_dir):
    files = [
        ("file", ("notes.md", b"# Notes\n\nThe Lyon office has a blue door.", "text/markdown")),
        ("file", ("../../../etc/evil name.txt", b"Path tricks do not work here.", "text/plain")),
    ]
    reply = http.post("/v1/documents", files=files)
    assert reply.status_code == 201, reply.text
    assert reply.json()["ids"] == ["notes.md", "evil_name.txt"]
    assert not Path("/etc/evil name.txt").exists()
    assert http.get("/v1/documents/evil_name.txt").json()["metadata"]["filename"] == "evil_name.txt"
    binary = http.post(
        "/v1/documents", files=[("file", ("blob.bin", bytes(range(256)) * 4, "application/octet-stream"))]
    )
    assert_error(binary, 415)
    big = http.post("/v1/documents", files=[("file", ("big.txt", b"a" * (300 * 1024), "text/plain"))])
    assert_error(big, 413, code="request_too_large")


def test_delete_and_unknown_ids(http):
    assert http.post("/v1/documents", json=[{"id": "temp.md", "text": "Temporary."}]).status_code == 201
    assert http.delete("/v1/documents/temp.md").json() == {
        "id": "temp.md",
        "object": "document",
        "collection": "default",
        "deleted": True,
    }
    assert_error(http.delete("/v1/documents/temp.md"), 404, code="document_not_found")
    assert_error(http.get("/v1/documents/no-such-doc"), 404, code="document_not_found")


@pytest.mark.parametrize(
    ("body", "status", "contains"),
    [
        (b'{"question": ', 400, "not valid JSON"),
        (b"{}", 422, "question"),
        (b'{"question": ""}', 422, "question"),
        (b'{"question": "   "}', 422, "empty"),
        (json.dumps({"question": "x" * 501}).encode(), 422, "too long"),
        (b'{"question": "hi", "top_k": 0}', 422, "top_k"),
        (b'{"question": "hi", "top_k": 9}', 422, "top_k"),
        (b'{"question": "hi", "top_k": "many"}', 422, "top_k"),
        (b'{"question": "hi", "colour": "red"}', 422, "colour"),
        (b'{"question": "hi", "max_tokens": 2049}', 422, "limit of 2048"),  # the OpenAI routes: 400
    ],
)
def test_bad_questions(http, body, status, contains):
    reply = http.post("/v1/ask", content=body, headers={"content-type": "application/json"})
    assert_error(reply, status, contains=contains)


def _nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"content": b"[{", "headers": {"content-type": "application/json"}}, 400),
        ({"json": [{"id": "x"}]}, 422),
        ({"json": []}, 422),
        ({"json": [{"id": "x", "text": "  "}]}, 422),
        ({"content": b"hello", "headers": {"content-type": "text/plain"}}, 415),
        ({"json": [{"id": "bell\x07", "text": "x"}]}, 422),
        ({"json": [{"text": "x", "metadata": {"a": _nested(20)}}]}, 422),
        ({"content": b'[{"text": "a \\ud800"}]', "headers": {"content-type": "application/json"}}, 400),
        (
            {
                "content": b'[{"text": "a", "metadata": {"k\\udc00": 1}}]',
                "headers": {"content-type": "application/json"},
            },
            400,
        ),
    ],
)
def test_bad_documents(http, kwargs, status):
    assert_error(http.post("/v1/documents", **kwargs), status)


def test_server_keeps_serving(http):
    http.post("/v1/ask", content=b"{", headers={"content-type": "application/json"})
    assert _ask(http, "When does the bakery open?")["text"].strip()


def test_ingestion_persists(http, settings, engine):
    """What was acknowledged is in the saved index: a pipeline loaded from it (a reader: the server
    holds the directory for writing) has the documents."""
    from rag.pipeline import Pipeline

    assert (
        http.post("/v1/documents", json=[{"id": "durable.md", "text": "Saved before the 201."}]).status_code
        == 201
    )
    reloaded = Pipeline.load(settings.index_dir, engine=engine)
    ids = {getattr(d, "id", None) for d in reloaded.list_documents()}
    assert {"durable.md", "zorblax.md", "notes.md"} <= ids


def test_disconnect_mid_ask_stream_releases(server, engine):
    body = {"question": "Tell me everything about the Zorblax team.", "stream": True, "max_tokens": 300}
    with httpx.stream("POST", server.url + "/v1/ask", json=body, timeout=120) as reply:
        lines = reply.iter_lines()
        deltas = 0
        for line in lines:
            if line == "event: delta":
                deltas += 1
                if deltas == 2:
                    break
    idle = lambda: engine.stats()["running"] == 0 and engine.cache.stats().protected_bytes == 0  # noqa: E731
    assert wait_until(idle, timeout=20), engine.stats()


def test_tenants_do_not_share_the_ask_cache(serve, settings, pipeline):
    keys = {"sk-ask-tenant-a": "ask-a", "sk-ask-tenant-b": "ask-b"}
    with serve(settings.model_copy(update={"api_keys": keys}), pipeline=pipeline) as srv:

        def cached(key: str) -> int:
            reply = httpx.post(
                srv.url + "/v1/ask",
                json={"question": "Where did the Zorblax project start?", "max_tokens": 8},
                headers={"Authorization": f"Bearer {key}"},
                timeout=120,
            )
            assert reply.status_code == 200, reply.text
            return int(reply.json()["usage"]["cached_tokens"])

        cached("sk-ask-tenant-a")
        assert cached("sk-ask-tenant-a") > 0
        assert cached("sk-ask-tenant-b") == 0
        assert_error(httpx.post(srv.url + "/v1/ask", json={"question": "q"}), 401)
