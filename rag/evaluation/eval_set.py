"""Labelled retrieval questions over the bundled corpus, and their tuning / held-out split.

Two sets ship in ``rag/data``:

- ``eval_questions.json``: the project's first 80 questions (no kinds, no split).
- ``retrieval_eval.json``: questions written from the topics' text without looking at what any
  retriever returns, each with a ``kind`` (``keyword``: the topic's own vocabulary; ``paraphrase``:
  no word of a relevant topic's id or title; ``howto``: a task in a user's words), every topic whose
  text answers it, and a ``split``: ``tune`` (choose knobs here) or ``heldout`` (report only).

Example:
    >>> tune = load_retrieval_eval("tune")
    >>> {q.split for q in tune}
    {'tune'}
    >>> sorted({q.kind for q in tune})
    ['howto', 'keyword', 'paraphrase']
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Literal

Split = Literal["tune", "heldout"]
SPLITS: tuple[Split, ...] = ("tune", "heldout")
KINDS = ("keyword", "paraphrase", "howto")
RETRIEVAL_EVAL = "retrieval_eval.json"
TUNE_SHARE = 0.4


@dataclass(frozen=True)
class EvalQuestion:
    """A question, the topics (document ids of the bundled corpus) that answer it, its kind and split."""

    id: str
    question: str
    topics: frozenset[str]
    kind: str = ""
    split: str = ""
    primary: str = ""  # the topic it was written from (listed first in the file)


def read_questions(name_or_path: str | Path) -> list[EvalQuestion]:
    """Questions from a file in ``rag/data`` (by file name) or from any path of the same JSON shape."""
    path = Path(name_or_path)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    else:
        text = resources.files("rag").joinpath(f"data/{name_or_path}").read_text(encoding="utf-8")
    items = json.loads(text)["questions"]
    return [
        EvalQuestion(
            q["id"],
            q["question"],
            frozenset(q["topics"]),
            q.get("kind", ""),
            q.get("split", ""),
            q["topics"][0],
        )
        for q in items
    ]


def load_retrieval_eval(split: Split | Literal["all"] = "all") -> list[EvalQuestion]:
    """The independent set (``retrieval_eval.json``): one split, or ``"all"``."""
    if split not in (*SPLITS, "all"):
        raise ValueError(f"split must be one of {[*SPLITS, 'all']}, got {split!r}")
    questions = read_questions(RETRIEVAL_EVAL)
    return questions if split == "all" else [q for q in questions if q.split == split]


def stratified_split(questions: Sequence[EvalQuestion], tune_share: float = TUNE_SHARE) -> list[EvalQuestion]:
    """Assign ``tune`` to a ``tune_share`` of each kind, spread evenly over the primary topics.

    Within a kind, questions are taken in primary-topic order and every ``1 / tune_share``-th goes
    to tuning, so each kind gets its share (up to rounding) and the topics are spread over both
    splits.
    """
    if not 0.0 < tune_share < 1.0:
        raise ValueError(f"tune_share must be in (0, 1), got {tune_share}")
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(questions):
        by_kind[q.kind].append(i)
    split: dict[int, str] = {}
    for indices in by_kind.values():
        ordered = sorted(indices, key=lambda i: (questions[i].primary, i))
        for n, i in enumerate(ordered):
            split[i] = "tune" if int((n + 1) * tune_share) > int(n * tune_share) else "heldout"
    return [replace(q, split=split[i]) for i, q in enumerate(questions)]
