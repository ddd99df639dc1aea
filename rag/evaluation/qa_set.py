"""The answer-quality set (``rag/data/qa_eval.json``) and how an answer is scored against it.

How the set was made, without looking at any model's output:

* ``corpus`` items: single-fact questions written from the text of one topic of the bundled corpus
  (CPython's ``pydoc_data.topics``), each answer a distinctive value the topic states (an exception
  name, a dunder method, a PEP number, a version); the pipeline retrieves the chunks.
* ``fact`` items: one made-up fact chunk among real distractor chunks, at chunk position 1, 2, ...,
  k in turn (``rag.evaluation.qa_synthetic``, seeded templates; the file holds its output).
* ``two_fact`` items: two fact chunks; the answer needs both (``both``: two values, ``bridge``: a
  value of the person the other chunk names).

An answer is correct when, after normalising both (``normalise``: lower case, punctuation to spaces,
a dot kept between digits), every required value (one of its accepted forms) occurs in the answer as
whole words. No model judges anything.

Example:
    >>> qa = load_qa_set()
    >>> sorted({i.kind for i in qa})
    ['corpus', 'fact', 'two_fact']
    >>> normalise("It raises `StopIteration`, see 3.11.")
    'it raises stopiteration see 3.11'
    >>> is_correct("The code is 4417 [1].", [["4417"]]), is_correct("Code 44170.", [["4417"]])
    (True, False)
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

QA_EVAL = "qa_eval.json"
Kind = Literal["corpus", "fact", "two_fact"]
KINDS: tuple[Kind, ...] = ("corpus", "fact", "two_fact")
_PUNCT = re.compile(r"(?<!\d)\.|\.(?!\d)|[^\w.]+")


@dataclass(frozen=True)
class FactChunk:
    """A synthetic chunk: its document id (shown as the source) and its text."""

    doc_id: str
    text: str


@dataclass(frozen=True)
class QAItem:
    """One question. ``answers``: every required value, each as its accepted forms. Synthetic items
    carry their chunks: ``facts`` at 1-based ``positions`` among ``distractors`` ([topic, index])."""

    id: str
    kind: Kind
    subkind: str
    question: str
    answers: tuple[tuple[str, ...], ...]
    topic: str = ""  # corpus items: the topic it was written from
    facts: tuple[FactChunk, ...] = ()
    positions: tuple[int, ...] = ()
    distractors: tuple[tuple[str, int], ...] = field(default=())

    @property
    def chunks(self) -> int:
        """Chunks of a synthetic item's prompt (0 for corpus items: retrieval decides)."""
        return len(self.facts) + len(self.distractors)


def normalise(text: str) -> str:
    """Lower case, NFKC, every run of punctuation or space one space (a dot between digits stays)."""
    folded = unicodedata.normalize("NFKC", text).lower()
    return " ".join(_PUNCT.sub(" ", folded).split())


def is_correct(answer: str, required: Sequence[Sequence[str]]) -> bool:
    """Whether every required value (any of its forms) occurs in ``answer`` as whole words."""
    padded = f" {normalise(answer)} "
    return all(any(f" {normalise(form)} " in padded for form in forms) for forms in required)


def load_qa_set(path: str | Path | None = None) -> list[QAItem]:
    """The items of ``rag/data/qa_eval.json`` (or a file of the same shape), in file order."""
    if path is None:
        text = resources.files("rag").joinpath(f"data/{QA_EVAL}").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    return [_item(raw) for raw in json.loads(text)["items"]]


def _item(raw: dict[str, Any]) -> QAItem:
    kind = raw["kind"]
    if kind not in KINDS:
        raise ValueError(f"QA item {raw.get('id')!r}: kind {kind!r} is not one of {KINDS}")
    answers = tuple(tuple(forms) for forms in raw["answers"])
    if not answers or not all(answers):
        raise ValueError(f"QA item {raw['id']!r} has no expected answer")
    return QAItem(
        id=raw["id"],
        kind=kind,
        subkind=raw.get("subkind", kind),
        question=raw["question"],
        answers=answers,
        topic=raw.get("topic", ""),
        facts=tuple(FactChunk(f["doc_id"], f["text"]) for f in raw.get("facts", ())),
        positions=tuple(raw.get("positions", ())),
        distractors=tuple((str(t), int(i)) for t, i in raw.get("distractors", ())),
    )
