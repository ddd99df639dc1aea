"""Per-question outcomes of one answer-quality setting, and their summary against the reference.

For each question a setting ran: whether its answer is correct (``rag.evaluation.qa_set``), whether
its first ``agreement_tokens`` answer tokens equal full prefill's and whether the whole answer does,
the mean KL(full prefill || setting) over the reference answer's first positions (teacher-forced),
its engine TTFT (the prefill, queue excluded), and the prompt's reuse. The summary gives accuracy
with a 95% bootstrap interval, the paired difference to full prefill on the same questions (its own
interval), agreement, KL, TTFT and hit rates, and accuracy per kind and per fact position.

Example:
    >>> row = SettingOutcomes("x")
    >>> row.add(0, Outcome(correct=True, agree=True, exact=True, kl=0.0, ttft_s=0.2, prompt_tokens=10))
    >>> row.summary(SettingOutcomes("ref"), {0: ("fact", (1,))})["accuracy"]
    1.0
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rag.evaluation.metrics import bootstrap_interval


@dataclass(frozen=True)
class Outcome:
    """What one setting did on one question."""

    correct: bool
    agree: bool  # first agreement_tokens answer tokens equal full prefill's
    exact: bool  # the whole answer equals full prefill's
    kl: float | None
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int = 0
    stitched_tokens: int = 0
    recomputed_tokens: int = 0
    deviation: float | None = None  # the engine's own estimate (chunks mode)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    scores: Any = None  # the reference's distributions over its answer's first positions
    prompt_hash: int = 0


@dataclass
class SettingOutcomes:
    """A setting's outcomes by question index (the stream position of the item)."""

    name: str
    by_item: dict[int, Outcome] = field(default_factory=dict)

    def add(self, index: int, outcome: Outcome) -> None:
        self.by_item[index] = outcome

    def summary(
        self, reference: SettingOutcomes, layout: Mapping[int, tuple[str, tuple[int, ...]]]
    ) -> dict[str, Any]:
        """Plain JSON-able figures; ``layout``: each question's kind and fact positions."""
        rows = list(self.by_item.values())
        if not rows:
            return {"questions": 0}
        correct = [float(o.correct) for o in rows]
        prompt = max(sum(o.prompt_tokens for o in rows), 1)
        deviations = [o.deviation for o in rows if o.deviation is not None]
        return {
            "questions": len(rows),
            "accuracy": statistics.fmean(correct),
            "accuracy_ci": bootstrap_interval(correct),
            **_paired(self, reference),
            **_same_prompts(self, reference),
            "agreement": statistics.fmean(float(o.agree) for o in rows),
            "exact": statistics.fmean(float(o.exact) for o in rows),
            "kl_mean": _mean([o.kl for o in rows if o.kl is not None]),
            "ttft_s_mean": statistics.fmean(o.ttft_s for o in rows),
            "ttft_s_p50": statistics.median(o.ttft_s for o in rows),
            "prompt_tokens_mean": prompt / len(rows),
            "hit_rate": sum(o.cached_tokens for o in rows) / prompt,
            "reuse_share": sum(o.cached_tokens + o.stitched_tokens for o in rows) / prompt,
            "recomputed_share": _share(rows),
            "deviation_mean": _mean(deviations),
            "deviation_kl_spearman": _spearman(
                [o.deviation for o in rows if o.deviation is not None and o.kl is not None],
                [o.kl for o in rows if o.deviation is not None and o.kl is not None],
            ),
            "by_kind": _accuracy_by(self, lambda i: layout[i][0]),
            "by_position": _accuracy_by(
                self, lambda i: str(layout[i][1][0]) if layout[i][0] == "fact" else None
            ),
        }


def _paired(row: SettingOutcomes, reference: SettingOutcomes) -> dict[str, Any]:
    """Accuracy minus full prefill's on the questions both ran, with a bootstrap interval, and full
    prefill's accuracy and interval on those questions."""
    both = [i for i in row.by_item if i in reference.by_item]
    if not both or row is reference:
        return {"paired_questions": len(both), "vs_reference": 0.0, "vs_reference_ci": (0.0, 0.0)}
    diffs = [float(row.by_item[i].correct) - float(reference.by_item[i].correct) for i in both]
    ref = [float(reference.by_item[i].correct) for i in both]
    return {
        "paired_questions": len(both),
        "reference_accuracy": statistics.fmean(ref),
        "reference_ci": bootstrap_interval(ref),
        "vs_reference": statistics.fmean(diffs),
        "vs_reference_ci": bootstrap_interval(diffs),
    }


def _same_prompts(row: SettingOutcomes, reference: SettingOutcomes) -> dict[str, Any]:
    """On the questions where the row's prompt was full prefill's, the share of whole answers equal
    (exact modes: 1.0 where the engine's reuse is exact)."""
    same = [
        i
        for i, o in row.by_item.items()
        if i in reference.by_item and o.prompt_hash == reference.by_item[i].prompt_hash
    ]
    return {
        "same_prompt_questions": len(same),
        "same_prompt_equal": statistics.fmean(float(row.by_item[i].exact) for i in same)
        if same
        else math.nan,
    }


def _accuracy_by(row: SettingOutcomes, key: Any) -> dict[str, dict[str, float]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for i, outcome in row.by_item.items():
        name = key(i)
        if name is not None:
            groups[name].append(float(outcome.correct))
    return {
        name: {"questions": len(v), "accuracy": statistics.fmean(v)} for name, v in sorted(groups.items())
    }


def _share(rows: Sequence[Outcome]) -> float:
    reused = sum(o.stitched_tokens + o.recomputed_tokens for o in rows)
    return sum(o.recomputed_tokens for o in rows) / reused if reused else 0.0


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Rank correlation (nan for fewer than 3 pairs or a constant side)."""
    if len(a) < 3:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    try:
        return statistics.correlation(ra, rb)
    except statistics.StatisticsError:
        return math.nan


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks
