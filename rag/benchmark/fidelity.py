"""Fidelity of chunk reuse to full prefill: what the stitched KV does to the model's answers.

The reference is the same model behind an engine with caching off (full prefill). For each prompt and
each chunks-mode setting (``ChunkReuse``), on the real engine:

* the greedy answer (``answer_tokens`` tokens): first-token agreement, exact match, ROUGE-L F1 of
  its words against the reference answer's;
* the next-token distributions over the reference answer's first ``kl_positions`` tokens, teacher-forced
  (``Engine.score``): mean KL(reference || setting) per position.

Every request of one prompt (reference and settings, greedy and scored) is submitted at once, so the
engine decodes them as one batch; the engines run ``batch_invariant``, so batching changes no token.

Example:
    >>> rouge_l("the cat sat on the mat", "the cat lay on the mat")
    0.8333333333333334
    >>> round(kl_divergence(torch.log_softmax(torch.tensor([2.0, 0.0]), -1),
    ...                     torch.log_softmax(torch.tensor([1.0, 0.0]), -1)), 4)
    0.0671
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.chunks.reuse import ChunkReuse
from engine.engine import Engine
from engine.request import GenerationResult, final_result
from engine.sampling import SamplingParams


@dataclass(frozen=True)
class FidelityPrompt:
    """One prompt to compare on: ids, chunk spans, tenant, chunk context (``Prompt.chunk_context``)."""

    token_ids: list[int]
    chunk_spans: list[tuple[int, int]]
    namespace: str = ""
    chunk_context: list[int] = field(default_factory=list)


@dataclass
class SettingFidelity:
    """Per-prompt outcomes of one setting, in prompt order."""

    label: str
    first_token: list[bool] = field(default_factory=list)
    exact: list[bool] = field(default_factory=list)
    rouge_l: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)  # mean over the scored positions
    recomputed_share: list[float] = field(default_factory=list)  # of the stitched chunks' tokens

    def summary(self) -> dict[str, Any]:
        return {
            "prompts": len(self.first_token),
            "first_token_agreement": _mean(self.first_token),
            "greedy_exact_match": _mean(self.exact),
            "rouge_l": _mean(self.rouge_l),
            "kl_mean": _mean(self.kl),
            "kl_median": statistics.median(self.kl) if self.kl else float("nan"),
            "kl_max": max(self.kl, default=float("nan")),
            "recomputed_share": _mean(self.recomputed_share),
        }


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 over whitespace-separated words (1.0 for two empty texts)."""
    a, b = candidate.split(), reference.split()
    if not a and not b:
        return 1.0
    lcs = _lcs(a, b)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(reference || other) in nats between two log-probability vectors."""
    return float((reference.exp() * (reference - other)).sum())


def compare(
    engine: Engine,
    reference: Engine,
    prompts: Sequence[FidelityPrompt],
    settings: Sequence[ChunkReuse],
    *,
    answer_tokens: int,
    kl_positions: int,
    advance: Callable[[str], None] | None = None,
) -> dict[str, SettingFidelity]:
    """Run every prompt through the reference and every setting (``engine`` in chunks mode, whose cache
    should hold the prompts' chunk placements); returns the outcomes by setting label."""
    out = {s.label: SettingFidelity(s.label) for s in settings}
    greedy = SamplingParams(max_tokens=answer_tokens)
    for n, prompt in enumerate(prompts):
        ref = final_result(reference.stream(prompt.token_ids, greedy, namespace=prompt.namespace))
        forced = ref.token_ids[:kl_positions]
        ref_scoring = (
            reference.score(prompt.token_ids, forced, namespace=prompt.namespace) if forced else None
        )
        pending = [(s, *_submit(engine, prompt, greedy, s, forced)) for s in settings]  # decoded as a batch
        ref_scores = final_result(ref_scoring).scores if ref_scoring is not None else None
        for setting, answer_stream, score_stream in pending:
            answer = final_result(answer_stream)
            scores = final_result(score_stream).scores if score_stream is not None else None
            _record(out[setting.label], prompt, ref, answer, ref_scores, scores)
        if advance is not None:
            advance(f"fidelity prompt {n + 1}/{len(prompts)}")
    return out


def _submit(
    engine: Engine, prompt: FidelityPrompt, params: SamplingParams, setting: ChunkReuse, forced: list[int]
) -> tuple[Any, Any]:
    kwargs: dict[str, Any] = {
        "namespace": prompt.namespace,
        "reuse": setting,
        "chunk_spans": prompt.chunk_spans,
        "chunk_context": prompt.chunk_context,
    }
    answer = engine.stream(prompt.token_ids, params, **kwargs)
    score = engine.score(prompt.token_ids, forced, **kwargs) if forced else None
    return answer, score


def _record(
    row: SettingFidelity,
    prompt: FidelityPrompt,
    ref: GenerationResult,
    answer: GenerationResult,
    ref_scores: torch.Tensor | None,
    scores: torch.Tensor | None,
) -> None:
    row.first_token.append(bool(answer.token_ids[:1] == ref.token_ids[:1]))
    row.exact.append(answer.token_ids == ref.token_ids)
    row.rouge_l.append(rouge_l(answer.text, ref.text))
    if ref_scores is not None and scores is not None:
        row.kl.append(statistics.fmean(kl_divergence(r, s) for r, s in zip(ref_scores, scores)))
    stitched = answer.stitched_tokens + answer.recomputed_tokens
    if stitched:
        row.recomputed_share.append(answer.recomputed_tokens / stitched)


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def _mean(values: Sequence[float] | Sequence[bool]) -> float:
    return statistics.fmean(float(v) for v in values) if values else float("nan")
