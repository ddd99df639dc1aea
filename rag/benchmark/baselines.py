"""What a user without prefixrag would run on the same prompts.

- ``TransformersBaseline``: plain ``model.generate`` (no KV reuse across requests), the code a
  transformers user writes; TTFT is the wall time of ``generate(max_new_tokens=1)``.
- ``LlamaCppBaseline``: llama.cpp through ``llama-cpp-python`` with its RAM prompt cache, when that
  optional package is importable (``pip install 'prefixrag[llamacpp]'`` compiles llama.cpp). It runs
  the bundled GGUF file itself (Q4_1 weights, from which the engine's float32 copy was converted),
  with the engine's thread count; its figures are its own (see the class).

Example:
    >>> base = TransformersBaseline(loaded.model)              # doctest: +SKIP
    >>> base.ttft(prompt_ids)                                  # doctest: +SKIP
    3.9
    >>> llama_cpp_status()                                     # doctest: +SKIP
    (False, 'llama-cpp-python is not installed (optional extra: prefixrag[llamacpp]); skipped')
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rag.benchmark.engine_bench import generate_tpot


class TransformersBaseline:
    """``model.generate`` on token ids, greedy, one request at a time."""

    def __init__(self, model: Any, pad_token_id: int | None = None) -> None:
        self.model = model
        self.pad_token_id = pad_token_id

    def _generate(self, ids: Sequence[int], new_tokens: int) -> float:
        input_ids = torch.tensor([list(ids)])
        with torch.inference_mode():
            t0 = time.perf_counter()
            self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=self.pad_token_id,
            )
            return time.perf_counter() - t0

    def ttft(self, ids: Sequence[int]) -> float:
        """Seconds to the first token: one full prefill plus one sampling step."""
        return self._generate(ids, 1)

    def tpot(self, ids: Sequence[int], new_tokens: int) -> float:
        """Seconds per output token after the first (timed between tokens by a streamer)."""
        return generate_tpot(self.model, ids, new_tokens, self.pad_token_id)


def llama_cpp_status() -> tuple[bool, str]:
    """(available, note): whether ``llama_cpp`` can be imported, without importing it."""
    if importlib.util.find_spec("llama_cpp") is None:
        return False, (
            "llama-cpp-python is not installed (optional extra `prefixrag[llamacpp]`, it compiles "
            "llama.cpp); the llama.cpp baseline was skipped"
        )
    return True, "llama-cpp-python found: llama.cpp with its RAM prompt cache runs the bundled GGUF"


@dataclass(frozen=True)
class FirstToken:
    """One request's time to first token and the prompt tokens the system did not compute."""

    ttft_s: float
    cached_tokens: int


@dataclass(frozen=True)
class TimedAnswer:
    """A streamed answer timed by its client: first token, last token, tokens produced."""

    ttft_s: float
    last_token_s: float
    tokens: int

    @property
    def tpot_s(self) -> float:
        """Seconds per token after the first."""
        return (self.last_token_s - self.ttft_s) / max(self.tokens - 1, 1)


class LlamaCppBaseline:
    """llama.cpp (through llama-cpp-python) over the bundled GGUF, with its RAM prompt cache.

    Every figure is llama.cpp's own: TTFT and token times are taken by this client around its calls,
    cached tokens are the prompt tokens llama.cpp did not evaluate (it reuses the longest prefix held
    in its live context or in ``LlamaRAMCache``), bytes per cached prompt are its saved states' sizes.

    Example:
        >>> llama = LlamaCppBaseline(bundled_gguf(), cache_bytes=2 << 30, threads=2)   # doctest: +SKIP
        >>> llama.first_token(prompt_ids).cached_tokens                               # doctest: +SKIP
        0
    """

    def __init__(
        self, gguf_path: str, cache_bytes: int, n_ctx: int = 4096, threads: int | None = None
    ) -> None:
        from llama_cpp import Llama  # optional dependency

        threads = threads or torch.get_num_threads()  # the engine's threads, for a like-for-like run
        self.cache_bytes = cache_bytes
        self.llm = Llama(
            model_path=gguf_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False
        )
        self.evaluated: list[int] = []  # tokens handed to each llama.cpp eval call
        evaluate = self.llm.eval

        def counting_eval(tokens: Sequence[int]) -> None:
            self.evaluated.append(len(tokens))
            evaluate(tokens)

        self.llm.eval = counting_eval  # type: ignore[method-assign,unused-ignore]
        self.forget()

    def forget(self) -> None:
        """Drop everything cached: an empty RAM cache and an empty live context."""
        from llama_cpp import LlamaRAMCache

        self.cache = LlamaRAMCache(capacity_bytes=self.cache_bytes)
        self.llm.set_cache(self.cache)
        self.llm.reset()

    def first_token(self, ids: Sequence[int]) -> FirstToken:
        """One greedy token through the completion API (which consults and then fills the RAM cache)."""
        self.evaluated.clear()
        t0 = time.perf_counter()
        chunks = self.llm.create_completion(prompt=list(ids), max_tokens=1, temperature=0.0, stream=True)
        ttft = math.nan
        for _ in chunks:  # draining it saves the prompt's state into the RAM cache
            ttft = time.perf_counter() - t0 if math.isnan(ttft) else ttft
        computed = self.evaluated[0] if self.evaluated else len(ids)
        return FirstToken(ttft, len(ids) - computed)

    def ttft(self, ids: Sequence[int]) -> float:
        return self.first_token(ids).ttft_s

    def answer(self, ids: Sequence[int], tokens: int) -> TimedAnswer:
        """``tokens`` greedy tokens, end-of-sequence ignored (llama.cpp's token generator, which reuses the
        longest prefix of its live context), timed at each token."""
        times = []
        t0 = time.perf_counter()
        for _ in self.llm.generate(list(ids), temp=0.0, top_k=1, reset=True):
            times.append(time.perf_counter() - t0)
            if len(times) == tokens:
                break
        return TimedAnswer(times[0], times[-1], len(times))

    def kv_bytes_per_prompt(self) -> float:
        """Mean size of a saved llama.cpp state (KV and last logits) per prompt in the RAM cache."""
        states = self.cache.cache_state
        return self.cache.cache_size / len(states) if states else math.nan

    def weight_bytes(self) -> int:
        """Bytes of the model's tensors as llama.cpp loaded them."""
        import llama_cpp

        return int(llama_cpp.llama_model_size(self.llm.model))


def bundled_gguf() -> str:
    """Path of the bundled model's GGUF file (what llama.cpp loads)."""
    from engine.models import DEFAULT_MODEL, REGISTRY, bundled_gguf_path

    return str(bundled_gguf_path(REGISTRY[DEFAULT_MODEL]))
