"""`prefixrag bench-router`: the RAG workload against local replicas behind sglang-router.

One seeded request stream (questions over the bundled Python reference topics, Zipf popularity,
retrieved and assembled once, locally) is replayed by a few concurrent clients against:

- one replica, directly (it gets all the cores);
- N replicas behind sglang-router, ``cache_aware`` and ``round_robin`` (the cores split among them).

Per configuration: the token hit rate clients see (sum of ``usage.prompt_tokens_details.cached_tokens``
over the sum of prompt tokens; the replicas' own ``/v1/cache`` counters are reported beside it), the
same figure for an unbounded single cache that saw the whole stream (the oracle), and TTFT as the
client measures it (mean, p50, p95). Every replica shares this machine's cores, so throughput does not
scale with replicas here: what the comparison shows is where the prefixes land and what each request
waits for its first token.

Example:
    >>> cfg = RouterBenchConfig(requests=12, replicas=(2,), concurrency=2)
    >>> results = run_router_bench(cfg, Path("bench-results/router"))          # doctest: +SKIP
    >>> [(r["name"], round(r["token_hit_rate"], 2)) for r in results["configs"]]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

from engine.models import DEFAULT_MODEL
from engine.remote import RemoteEngine
from engine.sampling import SamplingParams
from rag.benchmark.oracle import PrefixOracle
from rag.benchmark.report import json_ready
from rag.benchmark.stats import summarize as ttft_summary
from rag.benchmark.workload import popularity_order, subject_of, topic_titles, zipf_weights

QUESTION_TEMPLATES = (
    "How does {subject} work?",
    "What are the exact rules for {subject}?",
    "Give a short example of {subject}.",
    "Which errors can {subject} raise, and when?",
    "When should I prefer {subject} over the alternatives?",
    "What changed about {subject} in recent Python versions?",
)


@dataclass(frozen=True)
class RouterBenchConfig:
    """What to run. ``replicas``: cluster sizes, each measured with every policy in ``policies``;
    ``single``: also measure one replica without a router. ``concurrency``: clients sending at once
    (the router's ``cache_aware`` spreads new prefixes by in-flight load, so it needs some)."""

    requests: int = 48
    skew: float = 1.2
    seed: int = 0
    top_k: int = 4
    concurrency: int = 3
    max_tokens: int = 8
    replicas: tuple[int, ...] = (2, 3)
    policies: tuple[str, ...] = ("cache_aware", "round_robin")
    single: bool = True
    single_threads: tuple[int, ...] = ()  # torch threads of the single replica (default: all cores)
    model: str = DEFAULT_MODEL
    index_dir: Path | None = None  # default: the demo's Python-reference index
    cache_bytes: int | None = 3 << 30  # per replica; room for the whole stream, so nothing is evicted

    def __post_init__(self) -> None:
        for name in ("requests", "top_k", "concurrency", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.skew >= 0:
            raise ValueError(f"skew must be >= 0, got {self.skew!r}")
        if any(n < 1 for n in (*self.replicas, *self.single_threads)):
            raise ValueError(
                f"replicas and single_threads must be >= 1, got {self.replicas!r}, {self.single_threads!r}"
            )
        unknown = set(self.policies) - {"cache_aware", "round_robin", "random", "power_of_two"}
        if unknown:
            raise ValueError(f"unknown policies {sorted(unknown)}")


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    topic: str
    question: str


@dataclass
class Outcome:
    """One request as the client saw it."""

    index: int
    ttft_s: float = 0.0
    total_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""


# ---- the stream ---------------------------------------------------------------------------------


def plan_stream(config: RouterBenchConfig, titles: dict[str, str]) -> list[PlannedRequest]:
    """Who asks what, in order: topics drawn by Zipf popularity (a seeded shuffle decides which
    topic is most popular), each with a question phrased from a template.

    >>> plan = plan_stream(RouterBenchConfig(requests=4), {"if": "The if statement", "for": "The for loop"})
    >>> len(plan), sorted({p.topic for p in plan}) <= ["for", "if"]
    (4, True)
    """
    rng = random.Random(config.seed)
    order = popularity_order(list(titles), config.seed)
    weights = zipf_weights(len(order), config.skew)
    plan = []
    for i in range(config.requests):
        topic = rng.choices(order, weights)[0]
        subject = subject_of(titles[topic])
        plan.append(PlannedRequest(i, topic, rng.choice(QUESTION_TEMPLATES).format(subject=subject)))
    return plan


def build_prompts(config: RouterBenchConfig, plan: Sequence[PlannedRequest]) -> list[list[int]]:
    """Retrieve and assemble every request once, locally (the same token ids for every config)."""
    from engine.paths import prefixrag_home
    from rag.config import RAGConfig
    from rag.ingestion.loaders import load_python_reference
    from rag.pipeline import Pipeline

    index_dir = config.index_dir or prefixrag_home() / "indexes" / "python-reference"
    # the engine is never called: it only lends the assembler its tokenizer and context length
    stub = RemoteEngine("http://127.0.0.1:9", config.model, max_context=8192)
    pipeline = Pipeline.from_config(RAGConfig(index_dir=index_dir, top_k=config.top_k), engine=stub)
    pipeline.add_documents(load_python_reference())  # a no-op for topics already indexed
    if pipeline.kb.last_ingest.added or pipeline.kb.last_ingest.updated:
        pipeline.save(index_dir)
    prompts = []
    for req in plan:
        chunks = pipeline.retrieve(req.question, config.top_k)
        prompts.append(list(pipeline.assemble(req.question, chunks).token_ids))
    return prompts


# ---- measuring ----------------------------------------------------------------------------------


def replay(
    url: str,
    model: str,
    prompts: Sequence[Sequence[int]],
    *,
    concurrency: int,
    max_tokens: int,
    tokenizer: Any = None,
) -> tuple[list[Outcome], float]:
    """Send every prompt (as text, decoded with ``tokenizer``, by default the model's) through ``url``
    with ``concurrency`` clients; outcomes in stream order and the wall time."""
    from engine.models import load_tokenizer

    tokenizer = tokenizer or load_tokenizer(model)
    params = SamplingParams(max_tokens=max_tokens)
    todo = iter(enumerate(prompts))
    lock = threading.Lock()
    outcomes: list[Outcome] = []

    def client() -> None:
        with RemoteEngine(url, model, prompt_format="text", timeout_s=600, tokenizer=tokenizer) as eng:
            while True:
                with lock:
                    nxt = next(todo, None)
                if nxt is None:
                    return
                outcomes.append(_one(eng, nxt[0], nxt[1], params))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(client) for _ in range(concurrency)]:
            future.result()
    return sorted(outcomes, key=lambda o: o.index), time.perf_counter() - t0


def _one(eng: RemoteEngine, index: int, ids: Sequence[int], params: SamplingParams) -> Outcome:
    try:
        r = eng.generate(list(ids), params)
    except (RuntimeError, ValueError) as exc:  # EngineError, QueueFullError, refusals
        return Outcome(index, error=f"{type(exc).__name__}: {exc}")
    return Outcome(index, r.ttft_s, r.total_s, r.prompt_tokens, r.cached_tokens)


def warm_up(worker_urls: Sequence[str], model: str) -> None:
    """One short unrelated request per replica: first-call costs stay out of the figures."""
    for url in worker_urls:
        with RemoteEngine(url, model, tokenizer=object(), timeout_s=300) as eng:
            eng.generate("Warm-up: say hi.", SamplingParams(max_tokens=2))


def summarize(
    name: str,
    outcomes: Sequence[Outcome],
    wall_s: float,
    before: Sequence[dict[str, Any]],
    after: Sequence[dict[str, Any]],
    *,
    replicas: int,
    policy: str,
) -> dict[str, Any]:
    """Figures of one configuration (``before``/``after``: each replica's /v1/cache around the run)."""
    ok = [o for o in outcomes if not o.error]
    ttfts = [o.ttft_s for o in ok]
    prompt = sum(o.prompt_tokens for o in ok)
    per_replica = [_replica_delta(b, a) for b, a in zip(before, after)]
    queried = sum(r["query_tokens"] for r in per_replica)
    return {
        "name": name,
        "replicas": replicas,
        "policy": policy,
        "requests": len(outcomes),
        "errors": [o.error for o in outcomes if o.error],
        "token_hit_rate": sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0,
        "replica_token_hit_rate": sum(r["hit_tokens"] for r in per_replica) / queried if queried else 0.0,
        "ttft_s": ttft_summary(ttfts),
        "hit_ttft_s": ttft_summary([o.ttft_s for o in ok if o.cached_tokens > 0.5 * o.prompt_tokens]),
        "miss_ttft_s": ttft_summary([o.ttft_s for o in ok if o.cached_tokens <= 0.5 * o.prompt_tokens]),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s else 0.0,
        "per_replica": per_replica,
    }


def _replica_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    def get(stats: dict[str, Any], section: str, key: str) -> int:
        return int(stats.get(section, {}).get(key, 0))

    return {
        "requests": get(after, "engine", "requests") - get(before, "engine", "requests"),
        "hit_tokens": get(after, "cache", "hit_tokens") - get(before, "cache", "hit_tokens"),
        "query_tokens": get(after, "cache", "query_tokens") - get(before, "cache", "query_tokens"),
        "evicted_tokens": get(after, "cache", "evicted_tokens") - get(before, "cache", "evicted_tokens"),
    }


# ---- configurations -----------------------------------------------------------------------------


@dataclass
class Target:
    """A running configuration: where to send requests and the replicas behind it."""

    url: str
    replicas: list[Any] = field(default_factory=list)


def configurations(
    config: RouterBenchConfig, log_dir: Path
) -> Iterator[tuple[str, int, str, Callable[[], AbstractContextManager[Target]]]]:
    """(name, replicas, policy, start) for every configuration to measure."""
    if config.single:
        for threads in config.single_threads or (os.cpu_count() or 1,):
            name = f"1 replica, {threads} thread{'s' if threads > 1 else ''} (no router)"
            yield name, 1, "-", partial(_single, config, threads, log_dir)
    for n in config.replicas:
        for policy in config.policies:
            yield f"{n} replicas, {policy}", n, policy, partial(_cluster, config, n, policy, log_dir)


@contextmanager
def _single(config: RouterBenchConfig, threads: int, log_dir: Path) -> Iterator[Target]:
    from rag.deploy.cluster import Replica

    env = _replica_env(config)
    with Replica(
        model=config.model, log_dir=log_dir, threads=threads, env=env, name=f"single-{threads}"
    ) as r:
        yield Target(r.url, [r])


@contextmanager
def _cluster(config: RouterBenchConfig, n: int, policy: str, log_dir: Path) -> Iterator[Target]:
    from rag.deploy.cluster import Cluster, Policy

    with Cluster(
        n,
        cast(Policy, policy),
        model=config.model,
        log_dir=log_dir / f"{n}-{policy}",
        env=_replica_env(config),
    ) as c:
        yield Target(c.url, list(c.replicas))


def _replica_env(config: RouterBenchConfig) -> dict[str, str]:
    # RAM caches only: a disk tier the replicas share (and that outlives the run) would blur what routing does
    env = {"PREFIXRAG_ENGINE__DISK_CACHE_BYTES": "0"}
    if config.cache_bytes:
        env["PREFIXRAG_ENGINE__CACHE_BYTES"] = str(config.cache_bytes)
    return env


def measure(
    config: RouterBenchConfig,
    prompts: Sequence[Sequence[int]],
    start: Callable[[], AbstractContextManager[Target]],
    *,
    name: str,
    replicas: int,
    policy: str,
) -> dict[str, Any]:
    with start() as target:
        warm_up([r.url for r in target.replicas], config.model)
        before = [r.cache_stats() for r in target.replicas]
        outcomes, wall = replay(
            target.url, config.model, prompts, concurrency=config.concurrency, max_tokens=config.max_tokens
        )
        after = [r.cache_stats() for r in target.replicas]
    return summarize(name, outcomes, wall, before, after, replicas=replicas, policy=policy)


def run_router_bench(
    config: RouterBenchConfig, out: Path, *, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run every configuration on the same stream; write ``router.json``, ``router.md`` and
    ``router.png`` into ``out``; return the results."""
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_stream(config, topic_titles())
    progress(f"retrieving and assembling {len(plan)} prompts")
    prompts = build_prompts(config, plan)
    results: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "machine": {"cpus": os.cpu_count()},
        "stream": {
            "requests": len(prompts),
            "distinct_topics": len({p.topic for p in plan}),
            "mean_prompt_tokens": statistics.fmean(len(p) for p in prompts),
            "oracle_token_hit_rate": _oracle_hit_rate(prompts),
        },
        "configs": [],
    }
    log_dir = Path(tempfile.mkdtemp(prefix="prefixrag-bench-router-"))
    for name, n, policy, start in configurations(config, log_dir):
        progress(f"measuring: {name}")
        try:
            row = measure(config, prompts, start, name=name, replicas=n, policy=policy)
        except BaseException:
            progress(f"failed; the processes' logs are in {log_dir}")
            raise
        results["configs"].append(row)
        progress(
            f"  hit rate {100 * row['token_hit_rate']:.1f}%, TTFT mean {row['ttft_s']['mean']:.2f} s "
            f"p50 {row['ttft_s']['p50']:.2f} s p95 {row['ttft_s']['p95']:.2f} s, "
            f"per replica {[r['requests'] for r in row['per_replica']]}, {len(row['errors'])} errors"
        )
    shutil.rmtree(log_dir, ignore_errors=True)
    (out / "router.json").write_text(json.dumps(json_ready(results), indent=2) + "\n")
    from rag.benchmark.router_report import write_plot, write_report

    write_plot(results, out / "router.png")
    write_report(results, out / "router.md")
    return results


def _oracle_hit_rate(prompts: Sequence[Sequence[int]]) -> float:
    """What one unbounded prefix cache that saw the whole stream would reuse (one namespace)."""
    oracle = PrefixOracle()
    for ids in prompts:
        oracle.serve(ids)
    return oracle.hit_rate
