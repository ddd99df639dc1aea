"""SamplingParams and sample(): greedy, temperature, top-k, top-p, repetition penalty, seeded."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
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
    """Pick the next token from ``logits [vocab]`` (float32). The arithmetic over the vocabulary runs
    on the calling thread, natively where it can (engine/native/sample.cpp), else in NumPy: torch would
    split a 49k-entry operation across its thread pool, and in a server each such operation wakes the
    pool's sleeping threads, several times the cost of the draw."""
    logits = apply_repetition_penalty(logits, history, params.repetition_penalty)
    plain = params.top_p == 1.0 and not 1 < params.top_k < logits.numel()
    draw = _native_draw() if plain or params.greedy else None
    if draw is not None:
        u = 0.0 if params.greedy else float(torch.rand(1, generator=generator, dtype=torch.float64))
        temperature = 0.0 if params.greedy else params.temperature
        return int(draw(logits.detach().float().contiguous(), temperature, u))
    if params.greedy:
        return int(torch.argmax(logits))
    # shift so the best logit is 0, and scale in float64: a tiny temperature (1e-300 is valid) then
    # gives 0 and -inf, never inf - inf or 0 / 0 = nan (softmax itself is shift-invariant)
    x = logits.detach().float().numpy().astype(np.float64)
    x -= x.max()
    with np.errstate(over="ignore"):  # a tiny temperature sends every other logit to -inf: intended
        x /= params.temperature
    if 0 < params.top_k < x.size:
        kth = np.partition(x, x.size - params.top_k)[x.size - params.top_k]
        x[x < kth] = -np.inf
    probs = np.exp(x)  # unnormalised: the best token has mass 1
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        ranked = probs[order]
        before = np.cumsum(ranked) - ranked  # mass of the better tokens
        # keep the smallest set whose mass reaches top_p (always at least one token)
        ranked[before > params.top_p * probs.sum()] = 0.0
        probs = np.zeros_like(probs)
        probs[order] = ranked
    return _inverse_cdf(probs, generator)


@functools.cache
def _native_draw() -> Callable[[torch.Tensor, float, float], int] | None:
    """The native draw where it runs here (AVX2 and FMA, not narrowed away), else None."""
    from engine.native.decode import avx2_function

    draw: Callable[[torch.Tensor, float, float], int] | None = avx2_function("sample_row")
    return draw


def _inverse_cdf(probs: np.ndarray, generator: torch.Generator | None) -> int:
    """One draw from ``probs`` (float64, unnormalised): the first token whose cumulative mass exceeds
    a uniform draw (a zero-mass token never is): one cumulative sum, where torch.multinomial's
    draw over a whole vocabulary costs many times more."""
    cumulative = np.cumsum(probs)
    u = float(torch.rand(1, generator=generator, dtype=torch.float64)) * cumulative[-1]
    return min(int(np.searchsorted(cumulative, u, side="right")), probs.size - 1)
