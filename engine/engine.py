"""Engine: generate / stream over a prefix-cached model. One worker thread owns the model.

A request's life, top to bottom:
  submit ─► Scheduler (longest cached prefix first, with aging)
         ─► _start:   match (capped at len-1) ─► lock ─► load cached KV
         ─► _prefill_next, one chunk per engine step, between the running requests' decode steps
                      (continuous batching: a long prompt delays a running stream's next token by at
                      most one chunk) ─► the last chunk (chunks mode: then the stitched chunks,
                      engine.chunks.stitcher) ─► first token (TTFT) ─► insert the prompt's exact KV
         ─► _advance: one decode step per running request per engine step (batched when the runner can)
         ─► _finish:  insert prompt+completion KV (the next turn hits) ─► unlock ─► final event
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.backend import TIER_FLUSH_TIMEOUT_S, BackendCapabilities
from engine.chunks.plan import check_spans, plan_stitch
from engine.chunks.reuse import ChunkReuse, chunks_unsupported_reason, resolve_reuse
from engine.chunks.sources import RequestCancelled
from engine.chunks.stitcher import ChunkStitcher, Stitched
from engine.config import EngineConfig
from engine.detokenizer import Detokenizer
from engine.dtype import choose_dtype, engine_dtype
from engine.encoding import PromptInput, encode_prompt
from engine.exact_reuse import ExactReuse, check_exact_reuse
from engine.fused import FusedLlamaRunner, drop_float_linears, fused_unsupported_reason
from engine.kv.block_pool import KVBlockPool
from engine.kv.buffer_pool import BufferPool, Held, Want
from engine.kv.codec import KVCodec, KVGeometry, compute_dtype, make_codec
from engine.kv.state import BLOCK_TOKENS, KVBuffer, skip_tokens
from engine.memory import trim_heap
from engine.models import DEFAULT_MODEL, load_model
from engine.openmp_pool import release_thread_pool
from engine.request import (
    EngineError,
    GenerationResult,
    QueueFullError,
    Request,
    RequestStream,
    StreamEvent,
    final_result,
)
from engine.runner import ModelRunner, prefix_reuse_blocker
from engine.runners import Runner, stitching_runner
from engine.sampling import SamplingParams, sample
from engine.saved_logits import SavedLogits
from engine.scheduler import Scheduler
from engine.tiers.chain import open_tiers
from engine.tiers.tier import KVTier
from engine.warm import WarmResult, warm_prompts
from prefix_cache import RadixCache

log = logging.getLogger(__name__)

_NS_SEP = "\x1f"  # joins model id and tenant namespace
_PUBLIC_SEP = "\x1e"  # follows the model id in the public namespace, which no tenant's can equal
# idle this long beside another open engine, the engine's thread frees its OpenMP team: libgomp
# throttles every team's spin while two are held (engine.openmp_pool), and back-to-back requests keep
# theirs. Alone it keeps it: a team built again costs the next request several ms
TEAM_KEEP_S = 0.02
_open_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


class Engine:
    """A causal LM behind a radix-tree prefix KV cache.

    Example:
        >>> eng = Engine.from_pretrained("smollm2-135m-instruct", cache_bytes=1 << 30)
        >>> r = eng.generate("What is the capital of France?", SamplingParams(max_tokens=16))
        >>> r.text, r.cached_tokens, round(r.ttft_s, 3)          # doctest: +SKIP
        >>> for ev in eng.stream([{"role": "user", "content": "Hi"}]):
        ...     print(ev.text, end="")
    """

    def __init__(
        self, model: Any, tokenizer: Any, *, model_id: str, config: EngineConfig | None = None
    ) -> None:
        self.config = config or EngineConfig(model=model_id)
        if self.config.num_threads and self.config.num_threads != torch.get_num_threads():
            torch.set_num_threads(self.config.num_threads)  # changes MKL's threading mode: only when asked
        self.model_id = model_id
        self.tokenizer = tokenizer
        self.kv_codec = make_codec(self.config.kv_dtype, compute_dtype(model))
        self.dtype = engine_dtype(self.config.dtype, str(compute_dtype(model)).removeprefix("torch."))
        self.kv_geometry = KVGeometry.from_config(model.config)
        self.runner = _make_runner(model, tokenizer, self.config, self.kv_codec)
        self.caching = self.config.enable_prefix_cache and self.config.cache_bytes > 0
        blocker = prefix_reuse_blocker(model.config)
        if self.caching and blocker:
            log.warning("prefix caching turned off for %s: %s", model_id, blocker)
            self.caching = False
        self.exact_reuse = self._check_exact_reuse()
        self.cache = RadixCache.from_config(self.config.cache_config())
        self.saved_logits = SavedLogits(self.config.saved_logits if self.caching else 0)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.buffers = BufferPool(self.config.buffer_pool_bytes)
        slab = self.config.kv_slab_bytes
        self.kv_blocks = KVBlockPool(BLOCK_TOKENS, slab) if slab else None
        self.scheduler = Scheduler(
            self._probe, max_waiting=self.config.max_waiting, aging_rate=self.config.aging_rate
        )
        self.tiers = open_tiers(self, model)  # disk, remote: under the RAM cache, one chain
        self.chunks_blocker = chunks_unsupported_reason(self.runner, self.caching)
        if self.config.reuse == "chunks" and self.chunks_blocker:
            log.warning("reuse='chunks' falls back to 'prefix' for %s: %s", model_id, self.chunks_blocker)
        stitching = stitching_runner(self.runner) if self.chunks_blocker is None else None
        self.stitcher = (
            ChunkStitcher(self.cache, stitching, self.buffers, self.tiers) if stitching is not None else None
        )
        self.capabilities = BackendCapabilities(
            prefix_probe=True, public_prefix=True, chunk_reuse=self.stitcher is not None, local_cache=True
        )
        self._chunks_fallback_logged = False
        self._running: list[Request] = []
        self._prefilling: Request | None = None  # started, its prompt part way through prefill
        self._wakeup = threading.Condition()
        self._stopping = False
        self._worker: threading.Thread | None = None
        self._counters = {
            "requests": 0,
            "finished": 0,
            "failed": 0,
            "cancelled": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "stitched_requests": 0,
            "stitched_tokens": 0,
            "recomputed_tokens": 0,
            "chunk_prefill_tokens": 0,
            "prefill_s": 0.0,
            "decode_s": 0.0,
            "prefill_chunks": 0,
            "saved_logits_hits": 0,  # requests whose whole prompt was cached, logits included
            "mixed_steps": 0,  # engine steps that ran a prefill chunk and a decode step
            "held_tokens": 0,  # matched tokens a request's recycled buffer already held (not copied)
        }
        release_thread_pool()  # loading ran OpenMP here: the engine's thread serves as the one team
        _open_engines.add(self)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model: str = DEFAULT_MODEL, **options: Any) -> Engine:
        """Load a registry model, local HF dir or hub id. ``options`` are EngineConfig fields
        (``cache_bytes``, ``dtype``, ``enable_prefix_cache``, ``weights``...), EngineConfig's defaults
        for the rest."""
        return cls.from_config(EngineConfig(model=str(model), **options))

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        loaded = load_model(config.model, dtype=choose_dtype(config.dtype).dtype)
        engine = cls(loaded.model, loaded.tokenizer, model_id=loaded.model_id, config=config)
        runner = engine.runner
        if isinstance(runner, FusedLlamaRunner) and (config.weights == "int8" or runner.packed):
            drop_float_linears(loaded.model)  # this engine owns the model; its runner holds its own copies
        return engine

    # ---- public API -------------------------------------------------------------------------
    @property
    def max_context(self) -> int:
        return self.runner.max_context

    def encode(self, prompt: PromptInput) -> list[int]:
        """Token ids for a prompt: text, ids, or chat messages (rendered with the chat template)."""
        return encode_prompt(self.tokenizer, prompt, self.runner.vocab_size)

    def generate(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        namespace: str = "",
        public_prefix: int = 0,
        reuse: str | ChunkReuse | None = None,
        chunk_spans: Sequence[tuple[int, int]] | None = None,
        chunk_context: Sequence[int] | None = None,
    ) -> GenerationResult:
        """Run one request to completion (thread-safe; concurrent calls are scheduled together)."""
        return final_result(
            self.stream(
                prompt,
                params,
                namespace=namespace,
                public_prefix=public_prefix,
                reuse=reuse,
                chunk_spans=chunk_spans,
                chunk_context=chunk_context,
            )
        )

    def stream(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        namespace: str = "",
        public_prefix: int = 0,
        reuse: str | ChunkReuse | None = None,
        chunk_spans: Sequence[tuple[int, int]] | None = None,
        chunk_context: Sequence[int] | None = None,
    ) -> RequestStream:
        """Yield text deltas as they are decoded. ``close()`` or ``cancel()`` on the returned stream
        (from any thread, started or not) cancels the request and releases its cache lock."""
        request = self.submit(
            prompt,
            params,
            namespace=namespace,
            public_prefix=public_prefix,
            reuse=reuse,
            chunk_spans=chunk_spans,
            chunk_context=chunk_context,
        )
        return RequestStream(request, self._cancel)

    def submit(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        namespace: str = "",
        public_prefix: int = 0,
        reuse: str | ChunkReuse | None = None,
        chunk_spans: Sequence[tuple[int, int]] | None = None,
        chunk_context: Sequence[int] | None = None,
    ) -> Request:
        """Validate and enqueue a request; consume ``request.events`` (or use stream/generate).

        ``public_prefix``: how many leading prompt tokens are public material (the caller vouches
        that they hold nothing of the tenant's): they are also read from and written to the public
        namespace, which every tenant shares. The rest of the prompt stays in ``namespace`` only.
        ``reuse``: None (the engine's ``config.reuse``), ``"prefix"``, ``"chunks"`` or a ``ChunkReuse``.
        ``chunk_spans``: ``(start, end)`` token ranges of the retrieved chunks in the prompt (ascending);
        the tokens before the first span are the prefix every chunk is cached after. Without spans,
        chunks mode has nothing to stitch and serves the request as prefix mode does.
        ``chunk_context``: token ids that stand between that prefix and a reused chunk where its KV is
        computed (its canonical placement; the same for every request that should share chunk KV;
        ``Prompt.chunk_context`` gives a stand-in passage). None: right after the prefix.
        """
        request = self._request(prompt, params, namespace, public_prefix, reuse, chunk_spans, chunk_context)
        return self._enqueue(request)

    def score(
        self,
        prompt: PromptInput,
        continuation: Sequence[int],
        *,
        namespace: str = "",
        reuse: str | ChunkReuse | None = None,
        chunk_spans: Sequence[tuple[int, int]] | None = None,
        chunk_context: Sequence[int] | None = None,
    ) -> RequestStream:
        """Teacher forcing: a request that feeds ``continuation`` instead of sampling; its result's
        ``scores`` (float32 ``[len(continuation), vocab]`` log-probabilities) hold the next-token
        distribution after the prompt and after each continuation prefix. Scheduled, batched and
        cached like any request (for measuring what a reuse mode does to the model's predictions)."""
        forced = encode_prompt(self.tokenizer, list(continuation), self.runner.vocab_size)
        if not forced:
            raise ValueError("continuation is empty: score needs at least one token")
        params = SamplingParams(max_tokens=len(forced), ignore_eos=True)
        request = self._request(prompt, params, namespace, 0, reuse, chunk_spans, chunk_context)
        request.forced_ids = forced
        return RequestStream(self._enqueue(request), self._cancel)

    def _request(
        self,
        prompt: PromptInput,
        params: SamplingParams | None,
        namespace: str,
        public_prefix: int,
        reuse: str | ChunkReuse | None,
        chunk_spans: Sequence[tuple[int, int]] | None,
        chunk_context: Sequence[int] | None = None,
    ) -> Request:
        """A validated request (not yet queued)."""
        params = params or SamplingParams()
        ids = self.encode(prompt)
        if not ids:
            raise ValueError("prompt is empty: it encodes to zero tokens")
        if len(ids) >= self.max_context:
            raise ValueError(f"prompt has {len(ids)} tokens; the model's context is {self.max_context}")
        if not isinstance(namespace, str):
            raise ValueError(f"namespace must be a string, got {type(namespace).__name__}")
        if isinstance(public_prefix, bool) or not isinstance(public_prefix, int) or public_prefix < 0:
            raise ValueError(f"public_prefix must be a non-negative int, got {public_prefix!r}")
        spans = check_spans(chunk_spans or (), len(ids))
        context = self._chunk_context(chunk_context, len(ids))
        return Request(
            prompt_ids=ids,
            params=params,
            namespace=self._namespace(namespace),
            detok=Detokenizer(self.tokenizer, params.stop),
            eos_ids=frozenset() if params.ignore_eos else self.eos_ids | frozenset(params.stop_token_ids),
            public_tokens=min(public_prefix, len(ids)),
            chunk_reuse=self._chunk_reuse(reuse),
            chunk_spans=spans,
            chunk_context=context,
        )

    def _chunk_context(self, context: Sequence[int] | None, prompt_tokens: int) -> tuple[int, ...]:
        """Checked ``chunk_context`` ids: in the vocabulary, and leaving room for the prompt's chunks."""
        if context is None:
            return ()
        if isinstance(context, (str, bytes)) or not isinstance(context, Sequence):
            raise ValueError(f"chunk_context must be a list of token ids, got {type(context).__name__}")
        ids = tuple(context)
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.runner.vocab_size:
                raise ValueError(
                    f"chunk_context must hold token ids in [0, {self.runner.vocab_size}), got {i!r}"
                )
        if len(ids) + prompt_tokens >= self.max_context:
            raise ValueError(
                f"chunk_context ({len(ids)} tokens) and the prompt ({prompt_tokens}) exceed the "
                f"model's context of {self.max_context}"
            )
        return ids

    def _enqueue(self, request: Request) -> Request:
        self._ensure_worker()
        with self._wakeup:
            try:
                self.scheduler.add(request)
            except QueueFullError as full:
                full.retry_after_s = self._retry_after_s()
                raise
            self._counters["requests"] += 1
            self._wakeup.notify()
        return request

    def warm(
        self, prompts: Sequence[PromptInput], *, namespace: str = "", progress: Any = None
    ) -> WarmResult:
        """Prefill ``prompts`` (system prompts, FAQ prompts...) into the prefix cache and, when there is
        one, the disk tier, waiting until their blocks are written; ``progress(done, total)`` after each."""
        if not self.caching:
            raise ValueError("warm needs the prefix cache: this engine has caching off")
        return warm_prompts(self, prompts, namespace=namespace, progress=progress)

    def _chunk_reuse(self, reuse: str | ChunkReuse | None) -> ChunkReuse | None:
        """A request's chunk settings (None: prefix mode); chunks mode falls back where unsupported."""
        default = self.config.chunk_reuse() if self.config.reuse == "chunks" else None
        policy = resolve_reuse(reuse, default)
        if policy is not None and self.chunks_blocker is not None:
            if not self._chunks_fallback_logged:
                log.warning("reuse='chunks' served as 'prefix' on %s: %s", self.model_id, self.chunks_blocker)
                self._chunks_fallback_logged = True
            return None
        return policy

    def cache_stats(self, namespace: str | None = None) -> Any:
        """The prefix cache's CacheStats, for one tenant namespace or (None) all of them."""
        return self.cache.stats(None if namespace is None else self._namespace(namespace))

    def _retry_after_s(self) -> float:
        """When a slot is likely to free up: the queue ahead, at the recent mean request duration."""
        finished = max(self._counters["finished"] + self._counters["cancelled"], 1)
        mean_s = (self._counters["prefill_s"] + self._counters["decode_s"]) / finished
        ahead = len(self.scheduler) + len(self._running) + (self._prefilling is not None)
        return float(min(max(1.0, ahead * mean_s / self.config.max_running), 60.0))

    def cached_prefix_length(
        self, token_ids: Sequence[int], namespace: str = "", *, public: bool = False
    ) -> int:
        """How many leading tokens of ``token_ids`` the cache holds (no side effects), in ``namespace``
        or (``public``) in the public namespace."""
        if not self.caching:
            return 0
        where = self._public if public else self._namespace(namespace)
        return int(self.cache.peek_length(list(token_ids), namespace=where))

    def free_cache_tokens(self) -> int:
        """Tokens of KV the prefix cache can still take without evicting anything (0: caching off)."""
        if not self.caching:
            return 0
        stats = self.cache.stats()
        held = stats.cached_tokens
        per_token = stats.used_bytes / held if held else self.kv_codec.bytes_per_token(self.kv_geometry)
        return int((self.cache.capacity_bytes - stats.used_bytes) // max(per_token, 1))

    def _check_exact_reuse(self) -> ExactReuse:
        """This machine's verdict on reuse exactness for the runner (engine.exact_reuse)."""
        if not self.caching:
            return ExactReuse(None, "prefix caching is off: no KV is reused")
        if not self.config.check_exact_reuse:
            return ExactReuse(None, "not checked (check_exact_reuse=False)")
        verdict = check_exact_reuse(self.runner)
        if not verdict.exact:
            log.warning("reuse of cached KV is not bit-exact here (float rounding only): %s", verdict.reason)
        return verdict

    def stats(self) -> dict[str, Any]:
        """Engine counters plus the prefix cache's."""
        cache = self.cache.stats()
        return {
            "model": self.model_id,
            **self.exact_reuse.to_dict(),
            "weights": self.config.weights,
            "dtype": self.dtype.to_dict(),
            "weight_bytes": self.runner.weight_bytes(),
            "decode": getattr(
                self.runner, "decode_kernel", {"kernel": "layers", "reason": "transformers runner"}
            ),
            "prefill_rows": getattr(self.runner, "row_kernels", "torch"),
            "prefill_attention": getattr(self.runner, "attention_kernel", "torch"),
            "prefill_linears": getattr(self.runner, "linear_kernel", "torch"),
            "caching": self.caching,
            "waiting": len(self.scheduler),
            "running": len(self._running),
            "prefilling": int(self._prefilling is not None),
            **self._counters,
            "buffer_pool_bytes": self.buffers.nbytes,
            "saved_logits": {"prompts": len(self.saved_logits), "bytes": self.saved_logits.nbytes},
            "kv_slabs": self.kv_blocks.stats() if self.kv_blocks is not None else None,
            "cache": cache.to_dict() if hasattr(cache, "to_dict") else vars(cache),
            "kv": {
                "kv_dtype": self.kv_codec.name,  # as stored: 'float32' (no rounding) is the compute dtype
                "bytes_per_token": self.kv_codec.bytes_per_token(self.kv_geometry),
            },
            **self.tiers.stats(),  # "disk", "remote": each tier's figures, or None
        }

    @property
    def disk(self) -> KVTier | None:
        """The disk tier, if the engine has one (requests reach it through ``self.tiers``)."""
        return self.tiers.get("disk")

    def reset_cache(self) -> None:
        self.cache.reset()
        self.saved_logits.clear()

    def flush_tiers(self, timeout_s: float = TIER_FLUSH_TIMEOUT_S) -> bool | None:
        """Wait until the tiers under the RAM cache hold every block written so far: True when they
        do, False on timeout, None without a tier."""
        return self.tiers.flush(timeout_s)

    def close(self) -> None:
        """Stop the worker; waiting requests fail with EngineError."""
        _open_engines.discard(self)
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=60)
        for req in self.scheduler.drain():
            self._fail(req, EngineError("engine closed"))
        self.buffers.clear()
        self.tiers.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the worker loop ----------------------------------------------------------------------
    def step(self) -> None:
        """One scheduling step: prefill up to a step's token budget of waiting prompts (the one being
        prefilled, then the best waiting ones while a slot is free), then advance every running request
        by one token. The budget is ``mixed_prefill_tokens`` while requests decode (what a step may
        delay their next token by), ``prefill_chunk_tokens`` otherwise."""
        decoding = bool(self._running)
        used, prefilled = 0, False
        while True:
            # a request that starts decoding within the step caps the rest of it too
            budget = self.config.mixed_prefill_tokens if self._running else self.config.prefill_chunk_tokens
            if used >= budget:
                break
            if self._prefilling is None:
                request = self.scheduler.pop() if len(self._running) < self.config.max_running else None
                if request is None:
                    break
                self._guarded(request, self._start)
                continue  # started (now the one prefilling), finished or failed
            tokens = self._guarded(
                self._prefilling, lambda r, limit=budget - used: self._prefill_next(r, limit)
            )
            used += max(tokens or 0, 1)
            prefilled = True
        if self._running:
            self._counters["mixed_steps"] += prefilled and decoding
            self._advance_all()

    def _loop(self) -> None:
        untrimmed = False  # requests served since the heap was last trimmed
        teamed = False  # steps run since this thread's OpenMP team was last freed
        while True:
            if teamed and len(_open_engines) > 1 and self._quiet_for(TEAM_KEEP_S):
                release_thread_pool()  # idle: kept, it would throttle the other engine's team
                teamed = False
            idle_s = self.config.idle_trim_s
            if untrimmed and idle_s is not None and self._quiet_for(idle_s):
                trim_heap()  # idle after serving: hand what the finished requests freed back to the OS
                untrimmed = False
            with self._wakeup:
                while not self._stopping and not self._has_work():
                    self._wakeup.wait()
                if self._stopping:
                    break
            self.step()
            untrimmed = teamed = True
        for req in [*self._running, *([self._prefilling] if self._prefilling else [])]:
            self._fail(req, EngineError("engine closed"))

    def _quiet_for(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for work (a quiet moment: the responses go out too); whether the
        engine is still idle and not stopping."""
        with self._wakeup:
            if not self._stopping and not self._has_work():
                self._wakeup.wait(seconds)
            return not self._stopping and not self._has_work()

    def _has_work(self) -> bool:
        return bool(self._running) or self._prefilling is not None or len(self.scheduler) > 0

    def _start(self, req: Request) -> None:
        """Match the request's prompt, lock and load the cached prefix: it is then the one prefilling."""
        req.started = clock = time.perf_counter()
        if req.cancelled.is_set():
            self._finish(req, "cancelled")
            return
        ids = req.prompt_ids
        req.max_new_tokens = min(req.params.max_tokens, self.max_context - len(ids))
        if self.caching and req.chunk_reuse is None:  # a match may then cover the whole prompt
            req.saved_logits = self.saved_logits.get(req.namespace, ids)
        match = self._match(req)
        clock = req.phase("match", clock)
        want = Want(req.namespace, ids, match.length) if match.length else None
        req.buffer = self.buffers.take(self.runner.new_buffer, len(ids) + min(req.max_new_tokens, 512), want)
        held = req.buffer.length  # a finished request's KV of our first tokens, as the cache keeps it
        req.cached_tokens = held + req.buffer.load_prefix(skip_tokens(match.values, held), start=held)
        self._counters["held_tokens"] += held
        clock = req.phase("load", clock)
        if req.saved_logits is not None and req.cached_tokens < len(ids):  # its KV left the cache
            req.buffer.truncate(min(req.cached_tokens, len(ids) - 1))
            req.cached_tokens = req.buffer.length
            req.saved_logits = None
        if self.tiers and req.saved_logits is None:  # the tiers under RAM extend its match, same cap
            req.cached_tokens += self.tiers.extend(req.buffer, ids, req.namespace, limit=len(ids) - 1)
            clock = req.phase("tiers", clock)
        req.plan = (
            plan_stitch(len(ids), req.chunk_spans, req.cached_tokens, req.chunk_context)
            if req.chunk_reuse
            else None
        )
        req.prefilled = req.cached_tokens
        self._prefilling = req

    def _prefill_next(self, req: Request, limit: int) -> int:
        """Prefill the next chunk (``limit`` tokens at most) of the prefilling request's prompt; after
        its last chunk, its first token. Returns the tokens prefilled."""
        assert req.buffer is not None
        if req.cancelled.is_set():
            self._finish(req, "cancelled")
            return 0
        end = req.plan.exact_end if req.plan is not None else len(req.prompt_ids)
        step = min(limit, self.config.prefill_chunk_tokens)
        clock = time.perf_counter()
        chunk = req.prompt_ids[req.prefilled : min(end, req.prefilled + step)]
        # nothing to compute: a stitched prompt's exact part ended, or its saved logits (else None)
        logits = self.runner.prefill(chunk, req.buffer) if chunk else req.saved_logits
        req.prefilled += len(chunk)
        req.phases["prefill"] = req.phases.get("prefill", 0.0) + time.perf_counter() - clock
        self._counters["prefill_chunks"] += bool(chunk)
        if req.prefilled < end:
            return len(chunk)
        self._prefilling = None
        self._first_token(req, logits)
        return len(chunk)

    def _first_token(self, req: Request, logits: torch.Tensor | None) -> None:
        """The prompt is prefilled up to its plan's exact end (``logits``: of its last position, None
        when chunks mode stitches the rest): stitch, sample the first token, cache the prompt's KV."""
        clock = time.perf_counter()
        stitched = None
        if req.plan is not None and not req.cancelled.is_set():
            req.exact_end = req.plan.exact_end
            stitched = self._stitch(req, req.plan)
            logits = stitched.logits if stitched is not None else None
            req.phases["prefill"] = req.phases.get("prefill", 0.0) + time.perf_counter() - clock
        if req.cancelled.is_set() or logits is None:
            self._finish(req, "cancelled")
            return
        req.prefill_s = time.perf_counter() - req.started
        self._counters["prefill_s"] += req.prefill_s
        if req.saved_logits is not None:
            self._counters["saved_logits_hits"] += 1
        elif stitched is None and self.caching:  # an exact prefill's: the prompt's KV is cached next
            self.saved_logits.put(req.namespace, req.prompt_ids, logits)
        req.generator = req.params.make_generator()
        # the first token goes out before the cache copies the prompt's KV;
        # the copy still lands before the next request is matched. A request done at once (one token,
        # EOS) is inserted by _finish.
        self._emit(req, self._sample(req, logits))
        if stitched is not None:
            self._insert_placements(req, stitched)
        if not req.done.is_set():
            self._insert(req, len(req.prompt_ids))
            self._running.append(req)

    def _stitch(self, req: Request, plan: Any) -> Stitched | None:
        """The chunks-mode rest of the prompt after its exact part (None: cancelled meanwhile)."""
        assert self.stitcher is not None and req.buffer is not None and req.chunk_reuse is not None
        try:
            stitched = self.stitcher.stitch(
                req.buffer,
                req.prompt_ids,
                req.chunk_spans,
                plan,
                req.chunk_reuse,
                req.namespace,
                req.cancelled,
            )
        except RequestCancelled:
            return None
        req.phases.update(stitched.phases)
        req.stitched_tokens = stitched.stitched_tokens
        req.recomputed_tokens = stitched.recomputed_tokens
        req.stitch_deviation = stitched.deviation
        req.chunk_prefill_tokens = stitched.prefilled_tokens
        self._counters["stitched_requests"] += 1
        self._counters["chunk_prefill_tokens"] += stitched.prefilled_tokens
        return stitched

    def _insert_placements(self, req: Request, stitched: Stitched) -> None:
        """Cache the chunk placements computed for this request (exact KV of ``anchor + context + chunk``)."""
        clock = time.perf_counter()
        try:
            for key, kv in stitched.kv.placements:
                self.cache.insert(key, kv, namespace=req.namespace)
                self.tiers.persist(req.namespace, key)
        finally:
            assert self.stitcher is not None
            self.stitcher.recycle(stitched)
        req.phases["insert"] = req.phases.get("insert", 0.0) + time.perf_counter() - clock

    def _insert(self, req: Request, length: int) -> None:
        """Cache the KV of the request's first ``length`` tokens (timed as its "insert" phase)."""
        if not self.caching or req.buffer is None:
            return
        if req.exact_end is not None:  # chunks mode: stitched KV never enters the exact tree
            length = min(length, req.exact_end)
        clock = time.perf_counter()
        kv = req.buffer.segment(0, length, self.kv_blocks)
        tokens = req.all_ids[:length]
        self.cache.insert(tokens, kv, namespace=req.namespace)
        self.tiers.persist(req.namespace, tokens)  # write-behind: each tier's writer thread does the IO
        public = min(length, req.public_tokens)
        if public:  # only what was vouched public reaches the shared namespace
            self.cache.insert(tokens[:public], req.buffer.segment(0, public, self.kv_blocks), self._public)
            self.tiers.persist(self._public, tokens[:public])
        req.phases["insert"] = req.phases.get("insert", 0.0) + time.perf_counter() - clock

    def _match(self, req: Request) -> Any:
        """Longest cached prefix, capped so at least one prompt token is computed; locked for the request.
        It comes from the request's namespace, or from the public one when that holds more of the
        request's public prefix."""
        if not self.caching:
            return _NO_MATCH
        # the whole prompt where its logits are saved (nothing left to compute), else one token short
        namespace, cap = req.namespace, len(req.prompt_ids) - (req.saved_logits is None)
        if req.public_tokens:  # the public namespace, when it holds more of the public part
            public_cap = min(req.public_tokens, len(req.prompt_ids) - 1)
            public = self.cache.peek_length(req.prompt_ids, namespace=self._public, max_length=public_cap)
            if public > self.cache.peek_length(req.prompt_ids, namespace=namespace, max_length=cap):
                namespace, cap = self._public, public_cap
                req.saved_logits = None
        match = self.cache.match_prefix(req.prompt_ids, namespace=namespace, max_length=cap)
        self.cache.lock(match.node)
        req.node = match.node
        return match

    def _advance_all(self) -> None:
        live = []
        for req in list(self._running):
            if req.cancelled.is_set():
                self._guarded(req, lambda r: self._finish(r, "cancelled"))
            else:
                live.append(req)
        if not live:
            return
        t0 = time.perf_counter()
        rows = self._decode(live)
        self._counters["decode_s"] += time.perf_counter() - t0
        for req, row in rows:
            self._guarded(req, lambda r, row=row: self._emit(r, self._sample(r, row)))

    def _decode(self, live: list[Request]) -> list[tuple[Request, torch.Tensor]]:
        """One decode step for every live request, batched. A failing batch is retried one request at
        a time, so only a request that fails on its own fails (not the engine, not its batch mates)."""
        buffers = [r.buffer for r in live if r.buffer is not None]  # running: all have one
        try:
            logits = self.runner.decode_batch([r.output_ids[-1] for r in live], buffers)
            return list(zip(live, logits))
        except Exception as exc:
            if len(live) == 1:
                self._fail(live[0], exc)
                return []
            log.warning("batched decode of %d requests failed (%s); retrying one by one", len(live), exc)
        rows = []
        for req in live:
            try:
                assert req.buffer is not None
                req.buffer.truncate(len(req.all_ids) - 1)  # undo a step the failed batch may have taken
                rows.append((req, self.runner.decode_batch([req.output_ids[-1]], [req.buffer])[0]))
            except Exception as exc:
                self._fail(req, exc)
        return rows

    def _sample(self, req: Request, logits: torch.Tensor) -> int:
        if req.forced_ids is not None:  # scoring: record the distribution, feed the given token
            req.scores.append(torch.log_softmax(logits.float(), dim=-1))
            return req.forced_ids[len(req.output_ids)]
        history = (
            req.output_ids if req.params.repetition_penalty != 1.0 else ()
        )  # the answer only: copying facts from the context is the point
        return sample(logits, req.params, req.generator, history)

    def _emit(self, req: Request, token: int) -> None:
        first = not req.output_ids
        if first:
            req.first_token_at = time.perf_counter()
        req.output_ids.append(token)
        finish = None
        delta = ""
        if token in req.eos_ids:
            finish = "stop"
        else:
            delta = req.detok.push(token)
            if req.detok.stopped:
                finish = "stop"
            elif len(req.output_ids) >= req.max_new_tokens:
                finish = "length"
        if first:
            req.publish(
                StreamEvent(
                    delta,
                    [token],
                    req.id,
                    ttft_s=req.first_token_at - req.arrival,
                    cached_tokens=req.cached_tokens,
                    prompt_tokens=len(req.prompt_ids),
                )
            )
        elif delta:
            req.publish(StreamEvent(delta, [token], req.id))
        if finish:
            self._finish(req, finish)

    def _finish(self, req: Request, reason: str) -> None:
        if req in self._running:
            self._running.remove(req)
        if self._prefilling is req:
            self._prefilling = None
        buf = req.buffer
        try:
            if buf is not None and buf.length and reason != "error":
                # the KV of prompt + completion (the last sampled token was never fed) for the next turn
                self._insert(req, buf.length)
        finally:
            self._release(req, keep_kv=reason != "error")
        tail = req.detok.flush() if reason != "cancelled" else ""
        result = req.result(reason)
        key = {"cancelled": "cancelled"}.get(reason, "finished")
        self._counters[key] += 1
        self._counters["prompt_tokens"] += result.prompt_tokens
        self._counters["cached_tokens"] += result.cached_tokens
        self._counters["completion_tokens"] += result.completion_tokens
        self._counters["stitched_tokens"] += result.stitched_tokens
        self._counters["recomputed_tokens"] += result.recomputed_tokens
        req.publish(StreamEvent(tail, [], req.id, finish_reason=reason, result=result))
        req.done.set()

    def _fail(self, req: Request, exc: BaseException) -> None:
        log.warning("request %s failed: %s", req.id, exc)
        if req in self._running:
            self._running.remove(req)
        if self._prefilling is req:
            self._prefilling = None
        self._release(req, keep_kv=False)  # a failure may have left its buffer part written
        self._counters["failed"] += 1
        req.publish(exc)
        req.done.set()

    def _release(self, req: Request, keep_kv: bool = True) -> None:
        if req.node is not None:
            self.cache.unlock(req.node)
            req.node = None
        if req.buffer is not None:  # the cache copied what it keeps: the storage is free
            self.buffers.give(req.buffer, self._held(req) if keep_kv else None)
        req.buffer = None

    def _held(self, req: Request) -> Held | None:
        """The tokens whose KV the request's buffer holds as the cache keeps it (every token it fed
        but a chunks-mode prompt's stitched part and what followed), for a later request to start on."""
        assert req.buffer is not None
        length = req.buffer.length
        if req.plan is not None:
            length = min(length, req.plan.exact_end)
        if not self.caching or not length:
            return None
        return Held(req.namespace, tuple(req.all_ids[:length]))

    def _guarded(self, req: Request, fn: Any) -> Any:
        """``fn(req)``'s result; a failure fails that request alone (None)."""
        try:
            return fn(req)
        except Exception as exc:
            self._fail(req, exc)
            return None

    # ---- helpers --------------------------------------------------------------------------
    def _cancel(self, req: Request, wait_s: float = 120.0) -> None:
        """Cancel a request from any thread and wait until the worker has released its cache lock."""
        if req.done.is_set():
            return
        req.cancelled.set()
        with self._wakeup:
            self._wakeup.notify()
        req.done.wait(timeout=wait_s)

    def _ensure_worker(self) -> None:
        with self._wakeup:
            if self._stopping:
                raise EngineError("engine is closed")
            if self._worker is None or not self._worker.is_alive():
                release_thread_pool()  # this thread's OpenMP workers would throttle the engine's
                self._worker = threading.Thread(target=self._loop, name="prefixrag-engine", daemon=True)
                self._worker.start()

    def _namespace(self, tenant: str) -> str:
        return f"{self.model_id}{_NS_SEP}{tenant}"

    @property
    def _public(self) -> str:
        """The namespace of public prefixes (operator material every tenant may reuse)."""
        return f"{self.model_id}{_PUBLIC_SEP}"

    def _probe(self, req: Request) -> int:
        if not self.caching:
            return 0
        return int(self.cache.peek_length(req.prompt_ids[:-1], namespace=req.namespace))


@dataclass(frozen=True)
class _NoMatch:
    length: int = 0
    values: tuple[Any, ...] = ()
    node: Any = None


_NO_MATCH = _NoMatch()


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(t) for t in source)
    return frozenset(ids)


def _make_runner(model: Any, tokenizer: Any, config: EngineConfig, codec: KVCodec) -> Runner:
    """'auto' picks the fused runner when the architecture allows it, else transformers' forward."""
    if config.runner == "hf":
        return ModelRunner(model, kv_codec=codec)
    reason = fused_unsupported_reason(model)
    if reason is None:
        return FusedLlamaRunner(
            model,
            batch_invariant=config.batch_invariant,
            exact_shapes=config.exact_shapes,
            native_decode=config.native_decode,
            weights=config.weights,
            tokenizer=tokenizer,
            kv_codec=codec,
        )
    if config.weights != "float32":
        raise ValueError(
            f"weights={config.weights!r} needs the fused runner, which cannot run this model: {reason}"
        )
    if config.runner == "fast":
        raise ValueError(f"runner='fast' cannot run this model: {reason}")
    log.info("using the transformers runner: %s", reason)
    return ModelRunner(model, kv_codec=codec)


__all__ = ["Engine", "KVBuffer"]
