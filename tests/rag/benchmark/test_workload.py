"""The workload generator: seeded, reproducible, Zipf-shaped, unique questions, well-formed follow-ups."""

from __future__ import annotations

from collections import Counter

import pytest

from rag.benchmark.workload import (
    WorkloadSpec,
    build_workload,
    plan_requests,
    popularity_order,
    subject_of,
    topic_titles,
    zipf_weights,
)

TITLES = topic_titles()


@pytest.mark.parametrize(
    ("n", "skew", "expected"),
    [
        (1, 1.0, [1.0]),
        (2, 0.0, [0.5, 0.5]),
        (3, 1.0, [6 / 11, 3 / 11, 2 / 11]),
        (2, 2.0, [0.8, 0.2]),
    ],
)
def test_zipf_weights(n, skew, expected):
    assert zipf_weights(n, skew) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [{"requests": 0}, {"tenants": 0}, {"turns": 0}, {"top_k": 0}, {"skew": -1.0}])
def test_spec_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        WorkloadSpec(**bad)


@pytest.mark.parametrize(
    ("title", "subject"),
    [
        ('The "with" statement', 'the "with" statement'),
        ("Calls", "calls"),
        ('"pdb" — The Python Debugger', '"pdb" — The Python Debugger'),
    ],
)
def test_subject_of(title, subject):
    assert subject_of(title) == subject


def test_same_seed_same_stream_other_seed_other_stream():
    spec = WorkloadSpec(requests=200, seed=7, tenants=3, turns=2)
    assert plan_requests(spec, TITLES) == plan_requests(spec, TITLES)
    other = plan_requests(WorkloadSpec(requests=200, seed=8, tenants=3, turns=2), TITLES)
    assert [r.question for r in other] != [r.question for r in plan_requests(spec, TITLES)]


def test_popularity_is_a_seeded_permutation():
    names = list(TITLES)
    assert sorted(popularity_order(names, 0)) == sorted(names)
    assert popularity_order(names, 0) == popularity_order(names, 0)
    assert popularity_order(names, 0) != popularity_order(names, 1)


@pytest.mark.parametrize("skew", [0.6, 1.0, 1.4])
def test_topic_frequencies_follow_zipf(skew):
    spec = WorkloadSpec(requests=6000, skew=skew, seed=1)
    counts = Counter(r.topic for r in plan_requests(spec, TITLES))
    ranked = popularity_order(list(TITLES), spec.seed)
    weights = zipf_weights(len(ranked), skew)
    for rank in (0, 1, 4):
        share = counts[ranked[rank]] / spec.requests
        assert share == pytest.approx(weights[rank], rel=0.15), (rank, share, weights[rank])
    # log-log slope of rank vs count over the head is about -skew
    top, tenth = counts[ranked[0]], counts[ranked[9]]
    assert top / tenth == pytest.approx(10**skew, rel=0.35)


def test_more_skew_concentrates_requests():
    def top_share(skew: float) -> float:
        plan = plan_requests(WorkloadSpec(requests=3000, skew=skew), TITLES)
        return Counter(r.topic for r in plan).most_common(1)[0][1] / len(plan)

    assert top_share(0.0) < top_share(0.8) < top_share(1.6)
    assert top_share(0.0) < 3 / len(TITLES)  # uniform: about 1/79


def test_questions_are_unique_and_about_their_topic():
    plan = plan_requests(WorkloadSpec(requests=500, skew=1.6), TITLES)
    assert len({r.question for r in plan}) == len(plan)
    for r in plan:
        assert subject_of(TITLES[r.topic]) in r.question


def test_questions_are_about_30_tokens(llm_tokenizer):
    plan = plan_requests(WorkloadSpec(requests=300), TITLES)
    lengths = [len(llm_tokenizer.encode(r.question, add_special_tokens=False)) for r in plan]
    assert 22 <= sum(lengths) / len(lengths) <= 38
    assert max(lengths) <= 60


def test_tenants_and_follow_ups():
    plan = plan_requests(WorkloadSpec(requests=300, tenants=3, turns=3, seed=2), TITLES)
    assert {r.tenant for r in plan} == {"tenant-0", "tenant-1", "tenant-2"}
    first: dict[int, int] = {}
    for r in plan:
        if r.turn == 0:
            first[r.conversation] = r.index
            assert not r.previous_answer
        else:
            opener = plan[first[r.conversation]]
            assert opener.index < r.index and (opener.tenant, opener.topic) == (r.tenant, r.topic)
            assert r.previous_answer and r.turn <= 2
    assert sum(r.turn > 0 for r in plan) > 100


def test_single_turn_has_no_follow_ups():
    plan = plan_requests(WorkloadSpec(requests=100), TITLES)
    assert all(r.turn == 0 for r in plan)
    assert [r.conversation for r in plan] == list(range(100))


class _Searcher:
    def __init__(self) -> None:
        self.queries: list[tuple[str, int | None]] = []

    def search(self, query, top_k=None):
        self.queries.append((query, top_k))
        return []


def test_build_workload_retrieves_rag_turns_only():
    searcher = _Searcher()
    w = build_workload(WorkloadSpec(requests=40, turns=2, top_k=3), searcher, TITLES)
    rag_turns = [r for r in w.requests if r.turn == 0]
    assert [q for q, _ in searcher.queries] == [r.question for r in rag_turns]
    assert {k for _, k in searcher.queries} == {3}
    assert len(w.retrieve_ms) == len(rag_turns)
