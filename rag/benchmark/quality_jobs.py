"""The requests one answer-quality setting sends for one question, and how a wave of them is run.

A job is the setting's greedy answer and, teacher-forced on full prefill's answer, its next-token
distributions (``Engine.score``; full prefill scores its own answer). Stitched KV is never cached, so a chunks-mode job submits both at
once; an exact-mode job submits its scoring once the answer is done, whose prompt it then reuses
from the cache (exact: the same distributions a fresh prefill gives).

Jobs of one engine run as a wave: every job is submitted, and the engine decodes the running ones
as a batch (``batch_invariant``: batching changes no token). A job whose prompt depends on the
cache (the ``cache`` order's probe) is assembled only once the jobs before it have their first
token, which is when their prompts are in the cache; likewise a job is held until the jobs before
it have started, so that no later prompt's insert reaches an earlier job's stitched prefill.

Example:
    >>> jobs = [Job(engine, prompt, {"namespace": "qa"}, forced) for prompt in prompts]  # doctest: +SKIP
    >>> results = run_wave(jobs)                                                          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.engine import Engine
from engine.request import GenerationResult, StreamEvent, final_result
from engine.sampling import SamplingParams
from rag.prompt.assembler import Prompt

PromptFor = Callable[[], Prompt]  # assembles a job's prompt when the job is submitted


@dataclass
class Job:
    """One setting on one question. ``prompt``: built when submitted (``cache``-order prompts read
    the cache then). ``forced``: full prefill's answer tokens to score (empty: no scoring)."""

    engine: Engine
    prompt: PromptFor
    kwargs: dict[str, Any]
    forced: list[int]
    batch_scoring: bool = False  # chunks mode: score in the answer's batch
    score_own: int = 0  # the reference: score the first n tokens of its own answer instead
    built: Prompt | None = None
    _answer: Any = None
    _first: StreamEvent | None = None
    _scoring: Any = None
    _scoring_first: StreamEvent | None = None
    result: GenerationResult | None = field(default=None, init=False)
    scores: Any = field(default=None, init=False)

    def submit(self, params: SamplingParams) -> None:
        self.built = self.prompt()
        ids = self.built.token_ids
        kwargs = {**self.kwargs, **self.built.stitch_args()}
        self._answer = self.engine.stream(ids, params, **kwargs)
        if self.batch_scoring and self.forced:
            self._scoring = self.engine.score(ids, self.forced, **kwargs)

    def wait_started(self) -> None:
        """Block until the answer's first token (its prefill done, its exact prompt cached), and a
        batched scoring's."""
        self._first = next(self._answer)
        if self._scoring is not None:
            self._scoring_first = next(self._scoring)

    def finish(self) -> None:
        first = self._first
        self.result = first.result if first is not None and first.result else final_result(self._answer)
        if self.score_own:
            self.forced = self.result.token_ids[: self.score_own]
        if self._scoring is None and self.forced:
            assert self.built is not None
            kwargs = {**self.kwargs, **self.built.stitch_args()}
            self._scoring = self.engine.score(self.built.token_ids, self.forced, **kwargs)

    def finish_scoring(self) -> None:
        if self._scoring is None:
            return
        first = self._scoring_first
        done = first.result if first is not None and first.result else final_result(self._scoring)
        self.scores = done.scores


def run_wave(jobs: Sequence[Job], params: SamplingParams) -> None:
    """Submit ``jobs`` in order, each once the ones before it have started; then collect answers,
    then scores (an exact job's scoring is submitted as its answer completes)."""
    for job in jobs:
        job.submit(params)
        job.wait_started()
    for job in jobs:
        job.finish()
    for job in jobs:
        job.finish_scoring()
