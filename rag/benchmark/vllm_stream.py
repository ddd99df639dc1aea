"""The benchmark's RAG stream served by vLLM (automatic prefix caching, through ``engine.RemoteEngine``)
next to prefixrag's engine in prefix mode and in chunks mode, on the same assembled prompts.

The requests are the chunks section's: the first ``requests`` of the benchmark's seeded stream (turn
0), each prompt assembled once by the benchmark's pipeline (cache-aware chunk order) and sent as token
ids to all three. Chunks mode runs after every chunk the requests retrieve was warmed, as in the chunks
section. The order rotates request by request; a pause separates a vLLM request from the next one on
another system: vLLM's engine keeps a core busy polling for a while after each request, which would
take one of the next system's two cores. Once that poll has stopped, vLLM's next request starts
slower, so each system gets a few-token request right before each measured one: every system is
measured hot, as in steady serving.

Example:
    >>> run_stream("http://127.0.0.1:8000/v1", 24, print)["vLLM"]["ttft_s"]["mean"]   # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.engine import Engine
from engine.models import DEFAULT_MODEL, load_model
from engine.remote import RemoteEngine
from rag.benchmark.config import BenchConfig
from rag.benchmark.measure import TTFT_PARAMS, rotated
from rag.benchmark.stats import summarize
from rag.benchmark.sweep import bench_rag_config
from rag.benchmark.vllm_peer import SERVED_NAME
from rag.benchmark.workload import build_workload
from rag.pipeline import Pipeline
from rag.warming import warm_chunks

VLLM, PREFIX, CHUNKS = "vLLM (automatic prefix caching)", "prefixrag prefix", "prefixrag chunks (warmed)"
SPIN_PAUSE_S = 2.0  # longer than vLLM polls a core after a request (docs/benchmarks/native/README.md)
PING_TOKENS = 8  # under vLLM's 16-token cache block: a ping caches nothing the stream could reuse


def run_stream(vllm_url: str, requests: int, say: Callable[[str], None]) -> dict[str, Any]:
    """TTFT of each system on the same requests; vLLM's and prefixrag's reused tokens."""
    from rag.benchmark.run import demo_knowledge_base

    kb = demo_knowledge_base()
    spec = BenchConfig().workload_spec()
    stream = [r for r in build_workload(spec, kb).requests if r.turn == 0][:requests]
    model = load_model(DEFAULT_MODEL, dtype="auto")  # the engine's default dtype, as prefixrag serves
    configs = {
        PREFIX: EngineConfig(model=model.model_id, reuse="prefix"),
        CHUNKS: EngineConfig(model=model.model_id, reuse="chunks"),
    }
    engines = {
        name: Engine(model.model, model.tokenizer, model_id=model.model_id, config=config)
        for name, config in configs.items()
    }
    remote = RemoteEngine(vllm_url, SERVED_NAME, tokenizer=model.tokenizer, timeout_s=600)
    results: dict[str, dict[str, list[float]]] = {
        n: {"ttft_s": [], "reused": [], "prompt": []} for n in (VLLM, PREFIX, CHUNKS)
    }
    try:
        pipeline = Pipeline(bench_rag_config("cache"), engine=engines[CHUNKS], knowledge_base=kb)
        chunks = list({(h.doc_id, h.chunk_id): h for r in stream for h in r.hits}.values())
        warm_chunks(engines[CHUNKS], pipeline.assembler, chunks, "")
        prompts = [pipeline.assemble(r.question, r.hits, "") for r in stream]

        def ping(name: str) -> None:  # a few tokens that share no cache block with the stream
            ids = prompts[0].token_ids[:PING_TOKENS]
            if name == VLLM:
                remote.generate(ids, TTFT_PARAMS)
            else:
                engines[name].generate(ids, TTFT_PARAMS, namespace="warm-up")

        systems = [VLLM, PREFIX, CHUNKS]
        for name in systems:
            ping(name)
        for i, prompt in enumerate(prompts):
            for name in rotated(systems, i):
                ping(name)  # each system measured hot, as in steady serving
                if name == VLLM:
                    r = remote.generate(list(prompt.token_ids), TTFT_PARAMS)
                    time.sleep(SPIN_PAUSE_S)
                    reused = r.cached_tokens
                else:
                    reuse = "chunks" if name == CHUNKS else "prefix"
                    r = engines[name].generate(
                        list(prompt.token_ids), TTFT_PARAMS, reuse=reuse, **prompt.stitch_args()
                    )
                    reused = r.cached_tokens + r.stitched_tokens
                results[name]["ttft_s"].append(r.ttft_s)
                results[name]["reused"].append(reused)
                results[name]["prompt"].append(r.prompt_tokens)
            say(f"RAG stream: request {i + 1}/{len(prompts)}")
    finally:
        remote.close()
        for eng in engines.values():
            eng.close()
    out: dict[str, Any] = {"requests": len(stream), "pause_s": SPIN_PAUSE_S, "ping_tokens": PING_TOKENS}
    for name, got in results.items():
        out[name] = {
            "ttft_s": summarize(got["ttft_s"]),
            "reuse_share": sum(got["reused"]) / max(sum(got["prompt"]), 1),
            "samples": got["ttft_s"],
        }
    vllm_mean = out[VLLM]["ttft_s"]["mean"]
    for name in (PREFIX, CHUNKS):
        out[name]["vllm_over_this"] = vllm_mean / out[name]["ttft_s"]["mean"]
    return out
