"""The benchmark's request stream: questions over the corpus topics with Zipf popularity, seeded.

A stream is planned first (topics, tenants, conversations, question texts: pure and fast, so it is
unit-tested on its own), then each RAG turn's question is retrieved once against the knowledge base.
Every configuration of the benchmark replays the very same requests and hits.

Example:
    >>> spec = WorkloadSpec(requests=5, skew=1.0, seed=3)
    >>> plan = plan_requests(spec, {"with": 'The "with" statement', "try": 'The "try" statement'})
    >>> len(plan), plan[0].turn, plan[0].tenant
    (5, 0, 'tenant-0')
    >>> len({p.question for p in plan}) == 5                  # every question is unique
    True
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from rag.benchmark.texts import ACKS, ASKS, FOLLOW_UPS, LEADS
from rag.types import ScoredChunk

ANSWER_TEMPLATE = (
    "In short, {subject} works as the passages describe [1]. The precise rule is stated in [1], "
    "and the edge cases are covered in [2]."
)


@dataclass(frozen=True)
class WorkloadSpec:
    """What stream to generate.

    ``skew``: Zipf exponent s of topic popularity (weight of the r-th most popular topic ~ 1/r^s;
    0 is uniform). ``turns``: turns per conversation (1: single questions); follow-ups come 1-4
    requests after the previous turn, carry the history and retrieve nothing new. ``topics`` limits
    the corpus to its first n topics (for tests).

    Example:
        >>> WorkloadSpec(requests=100, skew=1.2, tenants=2).tenants
        2
    """

    requests: int = 96
    skew: float = 1.0
    seed: int = 0
    tenants: int = 1
    turns: int = 1
    top_k: int = 4
    topics: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests", "tenants", "turns", "top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not self.skew >= 0:
            raise ValueError(f"skew must be >= 0, got {self.skew!r}")
        if self.topics is not None and self.topics < 1:
            raise ValueError(f"topics must be None or >= 1, got {self.topics!r}")


@dataclass(frozen=True)
class BenchRequest:
    """One request of the stream. ``turn`` 0 is a RAG question (``hits`` retrieved for it); a later
    turn is a follow-up in conversation ``conversation`` whose history ends with ``previous_answer``."""

    index: int
    tenant: str
    topic: str
    question: str
    conversation: int
    turn: int = 0
    previous_answer: str = ""
    hits: tuple[ScoredChunk, ...] = ()


@dataclass
class Workload:
    """A planned and retrieved stream, plus how long retrieval took (it is shared by every config)."""

    spec: WorkloadSpec
    requests: list[BenchRequest]
    popularity: list[str]  # topics, most popular first
    retrieve_ms: list[float] = field(default_factory=list)

    @property
    def retrieve_ms_median(self) -> float:
        return float(statistics.median(self.retrieve_ms)) if self.retrieve_ms else 0.0


class Searcher(Protocol):
    """What the workload needs from a knowledge base (``rag.knowledge_base.KnowledgeBase`` fits)."""

    def search(self, query: str, top_k: int | None = None) -> list[ScoredChunk]: ...


def zipf_weights(n: int, skew: float) -> list[float]:
    """Normalised Zipf weights for ranks 1..n: w_r ~ 1 / r**skew.

    >>> [round(w, 3) for w in zipf_weights(3, 1.0)]
    [0.545, 0.273, 0.182]
    >>> zipf_weights(2, 0.0)
    [0.5, 0.5]
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    raw = [1.0 / (r**skew) for r in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def subject_of(title: str) -> str:
    """A topic title as a noun phrase inside a sentence: 'The "with" statement' -> 'the "with" statement'."""
    title = title.strip()
    if len(title) > 1 and title[0].isupper() and title[1].islower():
        return title[0].lower() + title[1:]
    return title


def topic_titles(limit: int | None = None) -> dict[str, str]:
    """Topic name -> title line of the bundled Python reference (the ids `load_python_reference` uses)."""
    from pydoc_data.topics import topics

    names = sorted(topics)[:limit]
    return {name: topics[name].strip().splitlines()[0] for name in names}


def plan_requests(spec: WorkloadSpec, titles: Mapping[str, str]) -> list[BenchRequest]:
    """The stream without retrieval: who asks what, in which order (deterministic for a seed)."""
    if not titles:
        raise ValueError("titles is empty: the workload needs at least one topic")
    rng = random.Random(spec.seed)
    popularity = popularity_order(list(titles), spec.seed)
    weights = zipf_weights(len(popularity), spec.skew)
    used: set[str] = set()
    pending: list[tuple[int, int, int]] = []  # (due index, conversation, turn)
    conversations: dict[int, BenchRequest] = {}
    out: list[BenchRequest] = []
    for i in range(spec.requests):
        due = [p for p in pending if p[0] <= i]
        if due:
            first = min(due)
            pending.remove(first)
            _, conv, turn = first
            out.append(_follow_up(i, conversations[conv], turn, rng, used, titles))
        else:
            conv = len(conversations)
            topic = rng.choices(popularity, weights)[0]
            tenant = f"tenant-{rng.randrange(spec.tenants)}"
            subject = subject_of(titles[topic])
            question = _unique(used, lambda: f"{rng.choice(LEADS)} {rng.choice(ASKS)}", subject)
            out.append(BenchRequest(i, tenant, topic, question, conv))
        request = out[-1]
        conversations[request.conversation] = request
        if request.turn + 1 < spec.turns:
            pending.append((i + rng.randint(1, 4), request.conversation, request.turn + 1))
    return out


def popularity_order(topics: Sequence[str], seed: int) -> list[str]:
    """Topics from most to least popular: a seeded shuffle, so popularity is not alphabetical."""
    order = sorted(topics)
    random.Random(f"popularity-{seed}").shuffle(order)
    return order


def build_workload(
    spec: WorkloadSpec, searcher: Searcher, titles: Mapping[str, str] | None = None
) -> Workload:
    """Plan the stream and retrieve ``top_k`` chunks for every RAG turn (once, shared by all configs)."""
    titles = topic_titles(spec.topics) if titles is None else titles
    requests, took = [], []
    for req in plan_requests(spec, titles):
        if req.turn == 0:
            t0 = time.perf_counter()
            hits = tuple(searcher.search(req.question, spec.top_k))
            took.append(1000 * (time.perf_counter() - t0))
            req = replace(req, hits=hits)
        requests.append(req)
    return Workload(spec, requests, popularity_order(list(titles), spec.seed), took)


def _follow_up(
    i: int, previous: BenchRequest, turn: int, rng: random.Random, used: set[str], titles: Mapping[str, str]
) -> BenchRequest:
    subject = subject_of(titles[previous.topic])
    answer = ANSWER_TEMPLATE.format(subject=subject)
    question = _unique(used, lambda: f"{rng.choice(ACKS)} {rng.choice(FOLLOW_UPS)}", subject)
    return BenchRequest(
        i, previous.tenant, previous.topic, question, previous.conversation, turn, answer, previous.hits
    )


def _unique(used: set[str], draw: Callable[[], str], subject: str) -> str:
    """A question text not used before in this stream (numbered once the phrase banks run out)."""
    text = ""
    for _ in range(64):
        text = draw().format(subject=subject)
        if text not in used:
            break
    else:
        text = f"{text} (case {len(used) + 1})"
    used.add(text)
    return text
