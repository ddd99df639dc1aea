"""The answer-quality set: its shape, that every expected answer is where the set says and nowhere it
must not be, that the synthetic part is the generator's output, and the scorer's matching rules."""

from __future__ import annotations

import json
from collections import Counter
from importlib import resources

import pytest

from rag.evaluation.qa_set import KINDS, is_correct, load_qa_set, normalise
from rag.evaluation.qa_synthetic import CHUNKS, DISTRACTOR_POOL, SEED, synthetic_items


@pytest.fixture(scope="module")
def items():
    return load_qa_set()


@pytest.fixture(scope="module")
def topics():
    from pydoc_data.topics import topics

    return topics


def test_enough_questions_of_every_kind(items):
    counts = Counter(i.kind for i in items)
    assert set(counts) == set(KINDS)
    assert len(items) >= 200 and min(counts.values()) >= 40
    assert len({i.id for i in items}) == len({i.question for i in items}) == len(items)


def test_synthetic_facts_stand_at_every_position_equally_often(items):
    single = Counter(i.positions for i in items if i.kind == "fact")
    assert set(single) == {(p,) for p in range(1, CHUNKS + 1)}
    assert len(set(single.values())) == 1
    pairs = Counter(i.positions for i in items if i.kind == "two_fact")
    assert len(pairs) == CHUNKS * (CHUNKS - 1) // 2 and max(pairs.values()) - min(pairs.values()) <= 1
    assert all(i.chunks == CHUNKS and len(i.facts) == len(i.positions) for i in items if i.kind != "corpus")
    assert {i.subkind for i in items if i.kind == "two_fact"} == {"both", "bridge"}


def test_corpus_answers_are_in_their_topic_and_not_in_the_question(items, topics):
    for item in (i for i in items if i.kind == "corpus"):
        assert is_correct(topics[item.topic], item.answers), item.id
        assert not is_correct(item.question, item.answers), item.id


def test_synthetic_answers_are_in_the_facts_only(items, topics):
    corpus = f" {normalise(' '.join(topics.values()))} "
    for item in (i for i in items if i.kind != "corpus"):
        facts = " ".join(f.text for f in item.facts)
        assert is_correct(facts, item.answers), item.id
        assert not is_correct(item.question, item.answers), item.id
        numeric = [form for forms in item.answers for form in forms if form.isdigit()]
        assert not any(f" {n} " in corpus for n in numeric), item.id  # no distractor holds it
        if item.subkind == "both":  # no chunk holds both values
            assert not any(is_correct(f.text, item.answers) for f in item.facts), item.id
        if item.subkind == "bridge":  # the room's chunk names a person, not what the question asks about
            entity, directory = item.facts
            assert is_correct(directory.text, item.answers) and not is_correct(entity.text, item.answers)
            person = directory.text.split(". ")[1].split(" has ")[0]
            assert person in entity.text and person not in item.question, item.id
        assert all(tuple(d) in DISTRACTOR_POOL for d in item.distractors)


def test_synthetic_part_is_the_generators_output():
    raw = json.loads(resources.files("rag").joinpath("data/qa_eval.json").read_text(encoding="utf-8"))
    assert raw["seed"] == SEED
    assert [i for i in raw["items"] if i["kind"] != "corpus"] == synthetic_items(SEED)


@pytest.mark.parametrize(
    ("answer", "required", "correct"),
    [
        ("It raises `StopIteration`.", [["StopIteration"]], True),
        ("It raises StopIterationError.", [["StopIteration"]], False),  # whole words only
        ("The method __enter__() is called.", [["__enter__"]], True),
        ("see enter", [["__enter__"]], False),
        ("Since Python 3.11, starred elements...", [["3.11"]], True),
        ("In 3.1 they...", [["3.11"]], False),
        ("The codes are 7209 and 5132 [1][2].", [["7209"], ["5132"]], True),
        ("The code is 7209 [1].", [["7209"], ["5132"]], False),  # every required value
        ("floor division by pow(2, n)", [["pow(2,n)"]], True),
        ("LEFT TO RIGHT", [["left to right"]], True),
    ],
)
def test_answers_match_as_normalised_whole_words(answer, required, correct):
    assert is_correct(answer, required) is correct


def test_normalise_keeps_dots_between_digits_only():
    assert normalise("Version 3.11. See .pdbrc!") == "version 3.11 see pdbrc"
