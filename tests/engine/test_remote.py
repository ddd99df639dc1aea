"""RemoteEngine against a real prefixrag server (uvicorn on 127.0.0.1, started and stopped here) and
against tiny local servers that misbehave: down, slow, malformed JSON, a stream cut short."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from engine import Engine, EngineConfig, EngineError, QueueFullError, RemoteEngine, SamplingParams
from engine.backend import BackendCapabilities, CacheProbe, cache_probe, local_cache
from rag.api import Settings, create_app
from rag.api.server import BackgroundServer
from rag.config import RAGConfig
from rag.deploy.cluster import free_port
from rag.ingestion.chunking import Chunker
from rag.knowledge_base import KnowledgeBase
from rag.pipeline import Pipeline
from tests.rag.corpus import SMALL_CORPUS
from tests.rag.test_pipeline import FACT

SYSTEM = "You answer questions about the Python language in one short sentence. " * 6
PARAMS = SamplingParams(max_tokens=6)


@pytest.fixture(scope="module")
def server(loaded_model: Any) -> Iterator[BackgroundServer]:
    engine = Engine(
        loaded_model.model,
        loaded_model.tokenizer,
        model_id=loaded_model.model_id,
        config=EngineConfig(model=loaded_model.model_id, num_threads=None),
    )
    app = create_app(Settings(warm_up=False), engine=engine)
    with BackgroundServer(app) as srv:
        yield srv
    engine.close()


@pytest.fixture
def remote(server: BackgroundServer, loaded_model: Any) -> Iterator[RemoteEngine]:
    with RemoteEngine(server.url + "/v1", loaded_model.model_id, tokenizer=loaded_model.tokenizer) as eng:
        yield eng


def chat(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


# ---- a real prefixrag server ------------------------------------------------------------------


def test_generate_token_ids_reports_usage_and_cache_hits_on_repeat(remote: RemoteEngine) -> None:
    ids = remote.encode(chat("What does the len() function return?"))
    first = remote.generate(ids, PARAMS)
    again = remote.generate(ids, PARAMS)
    assert first.text and first.text == again.text  # greedy by default
    assert first.prompt_tokens == again.prompt_tokens == len(ids)
    assert first.cached_tokens == 0
    assert again.cached_tokens == len(ids)  # the whole prompt: the engine saved its logits
    assert 0 < again.completion_tokens <= PARAMS.max_tokens
    assert first.finish_reason in ("stop", "length") and again.ttft_s > 0 and again.total_s >= again.ttft_s
    assert remote.prompt_format == "auto"  # prefixrag takes token ids: no fallback to text


def test_stream_yields_deltas_then_the_result(remote: RemoteEngine) -> None:
    events = list(remote.stream(chat("What is a tuple?"), SamplingParams(max_tokens=8)))
    deltas, last = events[:-1], events[-1]
    assert deltas and deltas[0].ttft_s is not None and all(e.text for e in deltas)
    assert last.result is not None and last.finish_reason == last.result.finish_reason
    assert "".join(e.text for e in deltas) == last.result.text
    assert last.result.request_id and all(e.request_id == last.result.request_id for e in events[1:])


def test_text_prompts_and_the_text_format(server: BackgroundServer, loaded_model: Any) -> None:
    ids = loaded_model.tokenizer.encode("The capital of France is")
    with RemoteEngine(server.url, loaded_model.model_id, prompt_format="text") as eng:  # tokenizer by name
        by_text = eng.generate(ids, SamplingParams(max_tokens=4))
        plain = eng.generate("The capital of France is", SamplingParams(max_tokens=4))
    assert by_text.text == plain.text and by_text.prompt_tokens == len(ids)
    assert plain.cached_tokens == len(ids)  # the decoded text re-tokenized to the same ids


def test_namespace_travels_as_cache_salt_and_isolates(remote: RemoteEngine) -> None:
    ids = remote.encode(chat("What is a frozenset?"))
    assert remote.generate(ids, PARAMS, namespace="tenant-a").cached_tokens == 0
    assert remote.generate(ids, PARAMS, namespace="tenant-a").cached_tokens > 0
    assert remote.generate(ids, PARAMS, namespace="tenant-b").cached_tokens == 0


def test_stats_and_max_context_come_from_the_server(remote: RemoteEngine, loaded_model: Any) -> None:
    assert remote.stats()["model"] == loaded_model.model_id
    assert remote.max_context == 8192  # from the server's /get_model_info


def test_server_side_refusals_are_value_errors(server: BackgroundServer, remote: RemoteEngine) -> None:
    with pytest.raises(ValueError, match=r"rejected the request \(404\).*no-such-model"):
        RemoteEngine(server.url, "no-such-model", tokenizer=remote.tokenizer).generate("hi", PARAMS)
    with pytest.raises(ValueError, match=r"\(400\).*max_tokens"):
        remote.generate("hi", SamplingParams(max_tokens=100_000))


def test_bad_arguments_fail_before_any_request(remote: RemoteEngine) -> None:
    for prompt in ([], "", [1, "2"], [1.5], None):
        with pytest.raises(ValueError, match="prompt"):
            remote.stream(prompt, PARAMS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="public_prefix"):
        remote.stream("hi", PARAMS, public_prefix=3)  # capabilities.public_prefix is off
    with pytest.raises(ValueError, match="base_url"):
        RemoteEngine("localhost:8000", "m")
    with pytest.raises(ValueError, match="prompt_format"):
        RemoteEngine("http://127.0.0.1:1", "m", prompt_format="ids")  # type: ignore[arg-type]


def test_pipeline_with_a_remote_engine_answers_as_the_local_engine_does(
    server: BackgroundServer, loaded_model: Any, embedder: Any
) -> None:
    """Retrieval and prompt assembly local, generation on the server: the same (greedy) answer."""
    # a remote engine cannot be probed, so its `cache` order is canonical; the local one would order by
    # what its cache holds (relevance when cold): compare the two with the same, fixed order
    config = RAGConfig(max_tokens=24, chunk_order="canonical")
    docs = [*SMALL_CORPUS, FACT]  # as tests/rag/test_pipeline.py
    question = "What is the secret code of the Zorblax project?"

    def pipeline(engine: Any) -> Pipeline:
        kb = KnowledgeBase(config, embedder=embedder, chunker=Chunker(loaded_model.tokenizer))
        p = Pipeline(config, engine=engine, knowledge_base=kb)
        p.add_documents(docs)
        return p

    with RemoteEngine(server.url, loaded_model.model_id, tokenizer=loaded_model.tokenizer) as eng:
        remote = pipeline(eng)
        first = remote.ask(question, top_k=2, namespace="pipeline-test")
        second = remote.ask("Who leads the Zorblax project?", top_k=2, namespace="pipeline-test")
    local_engine = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id)
    try:
        local = pipeline(local_engine).ask(question, top_k=2)
    finally:
        local_engine.close()
    assert "zorblax.md" in {s.doc_id for s in first.sources} and "Zorblax" in first.text
    assert first.text == local.text and first.usage.prompt_tokens == local.usage.prompt_tokens
    assert [s.chunk_id for s in first.sources] == [s.chunk_id for s in local.sources]
    assert first.usage.completion_tokens > 0 and first.timings.ttft_ms > 0
    assert second.usage.cached_tokens > 50  # the stable prefix, cached on the server


def test_a_remote_engine_states_no_optional_capability_and_the_pipeline_asks(
    remote: RemoteEngine, loaded_model: Any, embedder: Any
) -> None:
    """Its cache is the server's: nothing to probe, reset, warm or share from here. A pipeline told to
    share public prefixes asks the capability first, so the request goes out without one."""
    assert remote.capabilities == BackendCapabilities()
    assert cache_probe(remote) is None and local_cache(remote) is None
    assert not isinstance(remote, CacheProbe)
    config = RAGConfig(max_tokens=4, chunk_order="cache", public_collections=["default"])
    kb = KnowledgeBase(config, embedder=embedder, chunker=Chunker(loaded_model.tokenizer))
    pipeline = Pipeline(config, engine=remote, knowledge_base=kb)
    pipeline.add_documents([FACT])
    answer = pipeline.ask("What is the secret code of the Zorblax project?", namespace="asks")
    assert answer.usage.completion_tokens > 0 and answer.sources[0].doc_id == FACT.id


# ---- servers that misbehave -------------------------------------------------------------------


@contextmanager
def tiny_server(handle: Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]) -> Iterator[str]:
    """A throwaway HTTP server on 127.0.0.1 answering every POST with ``handle(handler, json_body)``;
    stopped on exit."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            handle(self, json.loads(self.rfile.read(int(self.headers.get("content-length", 0)))))

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def reply(handler: BaseHTTPRequestHandler, body: bytes, status: int = 200, ctype: str = "") -> None:
    handler.send_response(status)
    handler.send_header("content-type", ctype or "text/event-stream")
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_server_down_is_a_clear_engine_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with RemoteEngine(url, "m", tokenizer=object()) as eng, pytest.raises(EngineError, match="cannot reach"):
        eng.generate("hi", PARAMS)


def test_slow_server_times_out() -> None:
    release = threading.Event()

    def slow(handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        release.wait(10)  # never answers in time; set free at the end of the test

    with tiny_server(slow) as url, RemoteEngine(url, "m", timeout_s=0.5) as eng:
        t0 = time.monotonic()
        with pytest.raises(EngineError, match=r"timed out.*0\.5 s"):
            eng.generate("hi", PARAMS)
        release.set()
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    ("body", "ctype", "match"),
    [
        (b"<html>oops</html>", "text/html", "malformed JSON, not an event stream"),
        (b"data: {not json\n\n", "", "malformed JSON"),
        (b"data: [1, 2]\n\n", "", "expected an object"),
        (b"{broken", "application/json", "malformed JSON"),
        (b'data: {"choices": [{"index": 0, "text": "par"}]}\n\n', "", "before 'data: \\[DONE\\]'"),
        (b'data: {"error": {"message": "out of memory"}}\n\n', "", "reported an error: out of memory"),
    ],
)
def test_malformed_answers_are_clear_engine_errors(body: bytes, ctype: str, match: str) -> None:
    server = tiny_server(lambda h, _: reply(h, body, ctype=ctype))
    with server as url, RemoteEngine(url, "m") as eng, pytest.raises(EngineError, match=match):
        eng.generate("hi", PARAMS)


def test_error_statuses_map_to_exceptions() -> None:
    def busy(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        h.send_response(429)
        h.send_header("Retry-After", "3")
        h.send_header("content-length", "0")
        h.end_headers()

    with tiny_server(busy) as url, RemoteEngine(url, "m") as eng, pytest.raises(QueueFullError) as err:
        eng.generate("hi", PARAMS)
    assert err.value.retry_after_s == 3
    crash = b'{"error": {"message": "boom", "type": "server_error"}}'
    with (
        tiny_server(lambda h, _: reply(h, crash, 500, "application/json")) as url,
        RemoteEngine(url, "m") as eng,
        pytest.raises(EngineError, match=r"failed \(500\): boom"),
    ):
        eng.generate("hi", PARAMS)


def test_a_non_streaming_answer_is_accepted() -> None:
    """A server that ignores stream=true and sends the whole completion still works."""
    body = (
        b'{"id": "c1", "object": "text_completion", "choices": [{"index": 0, "text": "Paris", '
        b'"finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1, '
        b'"total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 4}}}'
    )
    with (
        tiny_server(lambda h, _: reply(h, body, ctype="application/json")) as url,
        RemoteEngine(url, "m") as eng,
    ):
        result = eng.generate("The capital of France is", PARAMS)
    assert (result.text, result.prompt_tokens, result.cached_tokens) == ("Paris", 5, 4)


def test_auto_format_falls_back_to_text_when_token_ids_are_refused(loaded_model: Any) -> None:
    """sglang-router answers a token-id prompt with 422 'prompt: ... StringOrArray'."""
    seen: list[Any] = []

    def router_like(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        seen.append(body["prompt"])
        if isinstance(body["prompt"], list):
            refusal = b"Failed to deserialize the JSON body into the target type: prompt: data did not match"
            reply(h, refusal, 422, "text/plain")
            return
        reply(
            h, b'data: {"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
        )

    ids = loaded_model.tokenizer.encode("Hello world")
    with tiny_server(router_like) as url:
        with RemoteEngine(url, "m", tokenizer=loaded_model.tokenizer) as eng:
            assert eng.generate(ids, PARAMS).text == "ok"
            assert eng.prompt_format == "text"
            assert eng.generate(ids, PARAMS).text == "ok"
        strict = RemoteEngine(url, "m", tokenizer=loaded_model.tokenizer, prompt_format="token_ids")
        with strict, pytest.raises(ValueError, match=r"\(422\).*prompt"):
            strict.generate(ids, PARAMS)
    assert seen == [ids, "Hello world", "Hello world", ids]  # one refusal, then text only


def test_request_ids_are_sent_and_echoed(server: BackgroundServer, remote: RemoteEngine) -> None:
    result = remote.generate("hi", SamplingParams(max_tokens=2))
    assert len(result.request_id) == 32  # ours, echoed back by the server's X-Request-Id
    echoed = httpx.get(server.url + "/healthz", headers={"X-Request-Id": "trace-7"})
    assert echoed.headers["x-request-id"] == "trace-7"
