"""Fidelity of int8 weights against float32 on the same prompts: greedy agreement, KL, perplexity.

Both runners share one loaded model. For every prompt, float32 decodes greedily and int8 is fed the
same tokens (teacher forcing), so at each step the two next-token distributions are compared on the
same history: their KL divergence, and whether int8's argmax is float32's token. int8's own greedy
answer equals float32's for the first ``n`` tokens exactly when the argmaxes agree at all ``n``
steps. Perplexity is measured on the bundled corpus (``pydoc_data.topics``), in windows read side by
side.

Example:
    >>> out = measure_fidelity(loaded, prompts, answer_tokens=32, corpus_tokens=1024)  # doctest: +SKIP
    >>> out["greedy_agreement"], out["int8"]["perplexity"]                            # doctest: +SKIP
    (1.0, 9.8)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.fused import FusedLlamaRunner
from engine.kv import KVBuffer
from engine.models import LoadedModel

CORPUS_TOPICS = ("execmodel", "function", "try", "with", "compound", "assignment", "truth", "comparisons")


def measure_fidelity(
    loaded: LoadedModel,
    prompts: Sequence[Sequence[int]],
    *,
    answer_tokens: int = 32,
    corpus_tokens: int = 1024,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """int8 against float32 on ``prompts`` (token ids) and on ``corpus_tokens`` tokens of the corpus."""
    if not prompts:
        raise ValueError("prompts is empty")
    if answer_tokens < 1 or corpus_tokens < 2:
        raise ValueError(
            f"need answer_tokens >= 1 and corpus_tokens >= 2, got {answer_tokens}, {corpus_tokens}"
        )
    say = progress or (lambda _msg: None)
    runners = {
        "float32": FusedLlamaRunner(loaded.model),
        "int8": FusedLlamaRunner(loaded.model, weights="int8", tokenizer=loaded.tokenizer),
    }
    shared = _common_prefix(prompts)
    prefixed = {name: _prefilled(r, prompts[0][:shared]) for name, r in runners.items()}
    kls: list[float] = []
    agreed: list[int] = []  # per prompt: steps until int8's argmax first differs from float32's token
    for i, ids in enumerate(prompts):
        say(f"fidelity: prompt {i + 1}/{len(prompts)}")
        step_kls, same = _teacher_forced(runners, prefixed, ids, shared, answer_tokens)
        kls += step_kls
        agreed.append(same)
    say("fidelity: corpus perplexity")
    corpus = corpus_ids(loaded.tokenizer, corpus_tokens)
    return {
        "prompts": len(prompts),
        "answer_tokens": answer_tokens,
        "greedy_agreement": sum(a == answer_tokens for a in agreed) / len(agreed),
        "agreed_tokens_mean": statistics.fmean(agreed),
        "kl_mean": statistics.fmean(kls),
        "kl_max": max(kls),
        "corpus_tokens": len(corpus),
        "float32": {"perplexity": perplexity(runners["float32"], corpus)},
        "int8": {"perplexity": perplexity(runners["int8"], corpus)},
    }


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
) -> tuple[list[float], int]:
    """KL(float32 || int8) at each of ``steps`` positions of float32's greedy answer, and how many
    leading steps int8's argmax agreed with float32's token."""
    logits = {}
    for name, runner in runners.items():
        prefixed[name].truncate(shared)
        logits[name] = runner.prefill(list(ids[shared:]), prefixed[name])
    kls, same, diverged = [], 0, False
    for _ in range(steps):
        p_log = torch.log_softmax(logits["float32"], dim=-1)
        q_log = torch.log_softmax(logits["int8"], dim=-1)
        kls.append(float(torch.sum(p_log.exp() * (p_log - q_log))))
        token = int(logits["float32"].argmax())
        diverged = diverged or int(logits["int8"].argmax()) != token
        same += not diverged
        for name, runner in runners.items():
            logits[name] = runner.decode_step(token, prefixed[name])
    return kls, same
