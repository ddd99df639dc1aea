"""What a user without prefixrag would run on the same prompts.

- ``TransformersBaseline``: plain ``model.generate`` (no KV reuse across requests), the code a
  transformers user writes; TTFT is the wall time of ``generate(max_new_tokens=1)``.
- ``LlamaCppBaseline``: llama.cpp through ``llama-cpp-python`` with its RAM prompt cache, when that
  optional package is importable (``pip install 'prefixrag[llamacpp]'`` compiles llama.cpp). It runs
  the bundled GGUF file itself (Q4_1 weights, not the float32 weights the engine runs).

Example:
    >>> base = TransformersBaseline(loaded.model)              # doctest: +SKIP
    >>> base.ttft(prompt_ids)                                  # doctest: +SKIP
    3.9
    >>> llama_cpp_status()                                     # doctest: +SKIP
    (False, 'llama-cpp-python is not installed (optional extra: prefixrag[llamacpp]); skipped')
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
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


class LlamaCppBaseline:
    """llama.cpp with ``LlamaRAMCache`` (its prompt cache) over the bundled GGUF model.

    Written against llama-cpp-python's documented API (``Llama``, ``LlamaRAMCache``,
    ``create_completion`` with a token-id prompt); only run where the optional package is installed.
    """

    def __init__(
        self, gguf_path: str, cache_bytes: int, n_ctx: int = 4096, threads: int | None = None
    ) -> None:
        from llama_cpp import Llama, LlamaRAMCache  # optional dependency

        self.llm = Llama(model_path=gguf_path, n_ctx=n_ctx, n_threads=threads, verbose=False)
        self.llm.set_cache(LlamaRAMCache(capacity_bytes=cache_bytes))

    def ttft(self, ids: Sequence[int]) -> float:
        t0 = time.perf_counter()
        self.llm.create_completion(prompt=list(ids), max_tokens=1, temperature=0.0)
        return time.perf_counter() - t0


def bundled_gguf() -> str:
    """Path of the bundled model's GGUF file (what llama.cpp loads)."""
    from engine.models import DEFAULT_MODEL, REGISTRY, bundled_gguf_path

    return str(bundled_gguf_path(REGISTRY[DEFAULT_MODEL]))
