"""SamplingParams and sample(): greedy, temperature, top-k, top-p, repetition penalty, seeded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

DEFAULT_MAX_TOKENS = 256  # an answer's length cap when nobody names one


@dataclass
class SamplingParams:
    """How to pick tokens. ``temperature=0`` is greedy (the default: grounded answers, reproducible).

    Example:
        >>> SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, seed=1, stop=["\\n\\n"])
        SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, top_k=0, stop=['\\n\\n'], seed=1, ...)
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or [])]
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 10.0:
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k!r}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if len(self.stop) > 16:
            raise ValueError(f"at most 16 stop strings, got {len(self.stop)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def make_generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        gen = torch.Generator()
        gen.manual_seed(int(self.seed))
        return gen


def apply_repetition_penalty(logits: torch.Tensor, history: Sequence[int], penalty: float) -> torch.Tensor:
    """CTRL-style penalty on tokens already seen (prompt + completion), as transformers applies it."""
    if penalty == 1.0 or not history:
        return logits
    ids = torch.tensor(sorted(set(history)), dtype=torch.long)
    picked = logits[ids]
    logits = logits.clone()
    logits[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    history: Sequence[int] = (),
) -> int:
    """Pick the next token from ``logits [vocab]`` (float32)."""
    logits = apply_repetition_penalty(logits, history, params.repetition_penalty)
    if params.greedy:
        return int(torch.argmax(logits))
    # shift so the best logit is 0, and scale in float64: a tiny temperature (1e-300 is valid) then
    # gives 0 and -inf, never inf - inf or 0 / 0 = nan (softmax itself is shift-invariant)
    logits = (logits.double() - logits.max().double()) / params.temperature
    if params.top_k > 0 and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # keep the smallest set whose mass reaches top_p (always at least one token)
        drop = cumulative - sorted_probs > params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs / probs.sum()
    return _inverse_cdf(probs, generator)


def _inverse_cdf(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from ``probs`` (float64, unnormalised): the first token whose cumulative mass exceeds
    a uniform draw (a zero-mass token never is): one cumulative sum, where torch.multinomial's
    draw over a whole vocabulary costs many times more."""
    cumulative = torch.cumsum(probs, dim=0)
    u = torch.rand(1, generator=generator, dtype=torch.float64) * cumulative[-1]
    return min(int(torch.searchsorted(cumulative, u, right=True)), probs.numel() - 1)
