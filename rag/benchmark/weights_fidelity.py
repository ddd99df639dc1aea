"""Fidelity of int8 weights against float32 on the same prompts: greedy agreement, KL, perplexity.

For every prompt, float32 decodes greedily and each candidate (int8 weights; bfloat16 as a scale
reference, a much smaller perturbation) is fed the same tokens (teacher forcing), so at each step
their next-token distributions are compared on the same history: KL(float32 || candidate), and
whether the candidate's argmax is float32's token. A candidate's own greedy answer equals float32's
for the first ``n`` tokens exactly when the argmaxes agree at all ``n`` steps. Perplexity is measured
on the bundled corpus (``pydoc_data.topics``), in windows read side by side.

Example:
    >>> out = measure_fidelity(loaded, prompts, answer_tokens=32, corpus_tokens=1024)  # doctest: +SKIP
    >>> out["int8"]["greedy_agreement"], out["int8"]["perplexity"]                    # doctest: +SKIP
    (0.27, 22.9)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.fused import FusedLlamaRunner
from engine.kv import KVBuffer
from engine.models import LoadedModel, load_model
from rag.benchmark.fidelity import kl_divergence
from rag.benchmark.limits import bfloat16_not_run

CORPUS_TOPICS = ("execmodel", "function", "try", "with", "compound", "assignment", "truth", "comparisons")
REFERENCE = "float32"


def measure_fidelity(
    loaded: LoadedModel,
    prompts: Sequence[Sequence[int]],
    *,
    answer_tokens: int = 32,
    corpus_tokens: int = 1024,
    bfloat16: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """int8 (and bfloat16) against float32 on ``prompts`` (token ids) and ``corpus_tokens`` corpus tokens."""
    if not prompts:
        raise ValueError("prompts is empty")
    if answer_tokens < 1 or corpus_tokens < 2:
        raise ValueError(
            f"need answer_tokens >= 1 and corpus_tokens >= 2, got {answer_tokens}, {corpus_tokens}"
        )
    say = progress or (lambda _msg: None)
    runners = {
        REFERENCE: FusedLlamaRunner(loaded.model),
        "int8": FusedLlamaRunner(loaded.model, weights="int8", tokenizer=loaded.tokenizer),
    }
    not_run = bfloat16_not_run()
    if bfloat16 and not not_run:
        runners["bfloat16"] = FusedLlamaRunner(load_model(loaded.model_id, dtype="bfloat16").model)
    shared = _common_prefix(prompts)
    prefixed = {name: _prefilled(r, prompts[0][:shared]) for name, r in runners.items()}
    kls: dict[str, list[float]] = {name: [] for name in runners if name != REFERENCE}
    agreed: dict[str, list[int]] = {name: [] for name in kls}  # per prompt: steps before the first miss
    for i, ids in enumerate(prompts):
        say(f"fidelity: prompt {i + 1}/{len(prompts)}")
        for name, (step_kls, same) in _teacher_forced(runners, prefixed, ids, shared, answer_tokens).items():
            kls[name] += step_kls
            agreed[name].append(same)
    say("fidelity: corpus perplexity")
    corpus = corpus_ids(loaded.tokenizer, corpus_tokens)
    out: dict[str, Any] = {
        "prompts": len(prompts),
        "answer_tokens": answer_tokens,
        "corpus_tokens": len(corpus),
        REFERENCE: {"perplexity": perplexity(runners[REFERENCE], corpus)},
    }
    if bfloat16 and not_run:
        out["bfloat16_not_run"] = not_run
    for name in kls:
        out[name] = {
            "greedy_agreement": sum(a == answer_tokens for a in agreed[name]) / len(prompts),
            "agreed_tokens_mean": statistics.fmean(agreed[name]),
            "kl_mean": statistics.fmean(kls[name]),
            "kl_max": max(kls[name]),
            "perplexity": perplexity(runners[name], corpus),
        }
    return out


def corpus_ids(tokenizer: Any, tokens: int) -> list[int]:
    """The first ``tokens`` tokens of a fixed run of Python-reference topics."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in CORPUS_TOPICS)
    return list(tokenizer.encode(text, add_special_tokens=False)[:tokens])


@torch.inference_mode()
def perplexity(runner: FusedLlamaRunner, ids: Sequence[int], windows: int = 8) -> float:
    """exp(mean negative log-likelihood) of the next token, over ``windows`` equal windows of ``ids``
    read side by side (one batched decode step per position: decode reads the weights once per step)."""
    span = len(ids) // windows
    if span < 2:
        raise ValueError(f"{len(ids)} tokens cannot fill {windows} windows of at least 2")
    rows = [list(ids[w * span : (w + 1) * span]) for w in range(windows)]
    buffers = [runner.new_buffer(span) for _ in rows]
    nll, count = 0.0, 0
    for t in range(span - 1):
        logits = runner.decode_batch([r[t] for r in rows], buffers)
        for r, row in zip(rows, logits):
            nll -= float(torch.log_softmax(row, dim=-1)[r[t + 1]])
            count += 1
    return math.exp(nll / count)


def _common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving at least one token of each to compute."""
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = next((j for j in range(n) if p[j] != prompts[0][j]), n)
    return max(n, 0)


def _prefilled(runner: FusedLlamaRunner, ids: Sequence[int]) -> KVBuffer:
    buffer = runner.new_buffer(4096)
    if ids:
        runner.prefill(list(ids), buffer)
    return buffer


@torch.inference_mode()
def _teacher_forced(
    runners: dict[str, FusedLlamaRunner],
    prefixed: dict[str, KVBuffer],
    ids: Sequence[int],
    shared: int,
    steps: int,
) -> dict[str, tuple[list[float], int]]:
    """Per candidate: KL(float32 || candidate) at each of ``steps`` positions of float32's greedy
    answer, and how many leading steps its argmax agreed with float32's token."""
    logits = {}
    for name, runner in runners.items():
        prefixed[name].truncate(shared)
        logits[name] = runner.prefill(list(ids[shared:]), prefixed[name])
    kls: dict[str, list[float]] = {name: [] for name in runners if name != REFERENCE}
    same = dict.fromkeys(kls, 0)
    diverged = dict.fromkeys(kls, False)
    for _ in range(steps):
        p_log = torch.log_softmax(logits[REFERENCE].float(), dim=-1)
        token = int(logits[REFERENCE].argmax())
        for name in kls:
            q_log = torch.log_softmax(logits[name].float(), dim=-1)
            kls[name].append(kl_divergence(p_log, q_log))
            diverged[name] = diverged[name] or int(logits[name].argmax()) != token
            same[name] += not diverged[name]
        for name, runner in runners.items():
            logits[name] = runner.decode_step(token, prefixed[name])
    return {name: (kls[name], same[name]) for name in kls}
