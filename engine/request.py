"""A generation request's lifetime state, and the results and events it produces."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from engine.chunks.reuse import ChunkReuse
from engine.detokenizer import Detokenizer
from engine.kv.state import KVBuffer
from engine.sampling import SamplingParams

FinishReason = Literal["stop", "length", "cancelled", "error"]
_ids = itertools.count(1)


@dataclass
class GenerationResult:
    """A finished generation. ``text`` and ``token_ids`` hold the completion only.

    Times are seconds (every ``*_s`` field and ``phases``; ``rag.Timings`` reports milliseconds, ``*_ms``).
    ``ttft_s`` runs from submission to the first token (queue wait included; ``queue_s`` says how much
    of it was waiting); ``total_s`` to the last.
    """

    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    total_s: float
    finish_reason: str
    queue_s: float = 0.0
    prefill_s: float = 0.0
    request_id: str = ""
    phases: dict[str, float] = field(default_factory=dict)  # seconds: match, load, prefill, insert
    reported_completion_tokens: int | None = None  # a remote server's count, when ids are not known
    reuse: str = "prefix"  # the reuse mode that served the request ("chunks": see stitched_tokens)
    stitched_tokens: int = 0  # prompt tokens whose KV came from cached chunks at other positions
    recomputed_tokens: int = 0  # tokens of those cached chunks recomputed over the stitched context
    # how far a stitched prompt was from exact: the share of the question's attention, at the selection
    # layer, on chunk KV that stayed stitched (engine.chunks.stitch); None when nothing was stitched
    stitch_deviation: float | None = None
    chunk_prefill_tokens: int = 0  # chunk tokens prefilled at their placement (not cached yet) and cached
    scores: Any = None  # Engine.score: float32 [continuation, vocab] next-token log-probabilities

    @property
    def completion_tokens(self) -> int:
        if self.reported_completion_tokens is not None:
            return self.reported_completion_tokens
        return len(self.token_ids)

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first."""
        n = len(self.token_ids) - 1
        return (self.total_s - self.ttft_s) / n if n > 0 else 0.0


@dataclass
class StreamEvent:
    """One step of a stream. The first event carries ``ttft_s``, ``cached_tokens`` and ``prompt_tokens``;
    the last carries ``finish_reason`` and the full ``result``."""

    text: str
    token_ids: list[int]
    request_id: str
    ttft_s: float | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    result: GenerationResult | None = None


def final_result(events: Iterable[StreamEvent], source: str = "the engine") -> GenerationResult:
    """Drain a stream; return the result its last event carries."""
    result = None
    for event in events:
        result = event.result or result
    if result is None:
        raise EngineError(f"{source} ended the stream without a final result")
    return result


class EngineError(RuntimeError):
    """A request failed inside the engine; the engine itself keeps serving."""


class QueueFullError(RuntimeError):
    """The bounded request queue is full; retry after ``retry_after_s``."""

    def __init__(self, depth: int, retry_after_s: float = 1.0) -> None:
        super().__init__(f"request queue is full ({depth} waiting); retry later")
        self.retry_after_s = retry_after_s


@dataclass
class Request:
    """Everything the worker tracks for one request, from queue to finish."""

    prompt_ids: list[int]
    params: SamplingParams
    namespace: str
    detok: Detokenizer
    eos_ids: frozenset[int]
    public_tokens: int = 0  # leading prompt tokens shared through the public namespace
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    arrival: float = field(default_factory=time.perf_counter)
    events: queue.SimpleQueue[StreamEvent | BaseException] = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    # set by the worker
    buffer: KVBuffer | None = None
    node: Any = None  # locked cache node
    cached_tokens: int = 0
    # the whole prompt's logits (engine.saved_logits): nothing to prefill
    saved_logits: torch.Tensor | None = None
    output_ids: list[int] = field(default_factory=list)
    generator: Any = None
    started: float = 0.0
    first_token_at: float = 0.0
    prefill_s: float = 0.0
    max_new_tokens: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    # chunks mode (engine.chunks.reuse): the request's settings and spans, what the stitch reused
    chunk_reuse: ChunkReuse | None = None
    chunk_spans: list[tuple[int, int]] = field(default_factory=list)
    chunk_context: tuple[int, ...] = ()  # between the anchor and a chunk at its canonical placement
    exact_end: int | None = None  # only the prompt's first exact_end tokens may be cached
    plan: Any = None  # chunks mode: the StitchPlan of the prompt (engine.chunks.plan)
    prefilled: int = 0  # prompt tokens the buffer holds so far (cached or prefilled)
    stitched_tokens: int = 0
    recomputed_tokens: int = 0
    stitch_deviation: float | None = None
    chunk_prefill_tokens: int = 0
    # Engine.score: tokens fed instead of sampled, and the log-probabilities seen before each
    forced_ids: list[int] | None = None
    scores: list[Any] = field(default_factory=list)
    # called (on the worker's thread) after each event is queued: RequestStream.watch
    listener: Callable[[], None] | None = None

    def publish(self, item: StreamEvent | BaseException) -> None:
        """Queue an event (or the error that ends the request) for its consumer, and tell a watcher."""
        self.events.put(item)
        listener = self.listener
        if listener is not None:
            listener()

    def phase(self, name: str, since: float) -> float:
        """Record the time since ``since`` under ``name``; return now."""
        now = time.perf_counter()
        self.phases[name] = now - since
        return now

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def result(self, finish_reason: str) -> GenerationResult:
        now = time.perf_counter()
        return GenerationResult(
            text=self.detok.text,
            token_ids=list(self.output_ids),
            prompt_tokens=len(self.prompt_ids),
            cached_tokens=self.cached_tokens,
            ttft_s=(self.first_token_at or now) - self.arrival,
            total_s=now - self.arrival,
            finish_reason=finish_reason,
            queue_s=(self.started or now) - self.arrival,
            prefill_s=self.prefill_s,
            request_id=self.id,
            phases=dict(self.phases),
            reuse="chunks" if self.chunk_reuse is not None else "prefix",
            stitched_tokens=self.stitched_tokens,
            recomputed_tokens=self.recomputed_tokens,
            stitch_deviation=self.stitch_deviation,
            chunk_prefill_tokens=self.chunk_prefill_tokens,
            scores=_stack(self.scores),
        )


class RequestStream(Iterator[StreamEvent]):
    """The events of one request. Iterate it; ``close()`` or ``cancel()`` from any thread, before or
    during iteration, cancels the request and waits until its cache lock is released.

    Example:
        >>> stream = engine.stream("Tell me a story", SamplingParams(max_tokens=200))  # doctest: +SKIP
        >>> first = next(stream)
        >>> stream.cancel()                       # e.g. the HTTP client went away
    """

    def __init__(self, request: Request, cancel: Callable[[Request], None]) -> None:
        self.request = request
        self._cancel_fn = cancel
        self._finished = False

    def __iter__(self) -> RequestStream:
        return self

    def __next__(self) -> StreamEvent:
        if self._finished:
            raise StopIteration
        return self._taken(self.request.events.get())

    @property
    def finished(self) -> bool:
        """Whether the last event (or the error) has been taken: closing then has nothing to do."""
        return self._finished

    def watch(self, notify: Callable[[], None]) -> None:
        """Call ``notify`` (from the engine's thread, so it must be quick and thread-safe, such as
        ``loop.call_soon_threadsafe``) after each new event, and once now; then :meth:`poll` takes
        the events without blocking: an asyncio consumer needs no thread of its own."""
        self.request.listener = notify
        notify()

    def poll(self) -> StreamEvent | None:
        """The next event if one is queued, else None; StopIteration after the last, as ``next``."""
        if self._finished:
            raise StopIteration
        try:
            item = self.request.events.get_nowait()
        except queue.Empty:
            return None
        return self._taken(item)

    def _taken(self, item: StreamEvent | BaseException) -> StreamEvent:
        if isinstance(item, BaseException):
            self._finished = True
            if isinstance(item, (QueueFullError, EngineError)):
                raise item
            # the request was validated at submit: anything the worker raised is the server's fault
            raise EngineError(f"generation failed: {type(item).__name__}: {item}") from item
        if item.finish_reason is not None:
            self._finished = True
        return item

    def cancel(self) -> None:
        if not self._finished:
            self._cancel_fn(self.request)

    def close(self) -> None:
        self.cancel()

    def __del__(self) -> None:  # a dropped, unfinished stream must not hold its cache lock forever
        if not self._finished and not self.request.done.is_set():
            self.request.cancelled.set()


def _stack(rows: list[Any]) -> Any:
    return torch.stack(rows) if rows else None
