"""A model-free stand-in for ``engine.Engine`` that makes the engine's exact prefix-cache calls.

Hit rates depend only on the token streams and on the cache's decisions, never on the KV numbers,
so replaying a request stream through a real ``RadixCache`` whose values are ``FakeKV`` of the
engine's real bytes per token gives the engine's per-request ``cached_tokens`` exactly, in
milliseconds instead of seconds of prefill. ``SimulatedEngine.serve`` mirrors ``Engine`` for a
request with ``max_tokens=1`` (what the benchmark's TTFT runs use): match capped at len-1 and locked,
then, the request being done at its first token, one insert of prompt+completion (the completion's one
token is never fed, so that is the prompt), unlock.

Example:
    >>> from engine.config import EngineConfig
    >>> sim = SimulatedEngine(None, model_id="m", max_context=8192,
    ...                       config=EngineConfig(cache_bytes=10 * 46_080), bytes_per_token=46_080)
    >>> sim.serve([1, 2, 3, 4]), sim.serve([1, 2, 3, 9]), sim.cache.used_bytes // 46_080
    (0, 3, 5)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from engine.config import EngineConfig
from engine.request import StreamEvent
from engine.sampling import SamplingParams
from prefix_cache import RadixCache

NAMESPACE_SEP = "\x1f"  # as the engine joins model id and tenant


class FakeKV:
    """``length`` tokens of KV that weigh ``bytes_per_token`` each and hold no data.

    Example:
        >>> kv = FakeKV(10, 46_080)
        >>> len(kv[2:5]), kv[2:5].nbytes, kv.copy().nbytes
        (3, 138240, 460800)
    """

    __slots__ = ("bytes_per_token", "length")

    def __init__(self, length: int, bytes_per_token: int) -> None:
        self.length = length
        self.bytes_per_token = bytes_per_token

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> FakeKV:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("FakeKV supports contiguous slices only")
        start, stop, _ = index.indices(self.length)
        return FakeKV(max(stop - start, 0), self.bytes_per_token)

    @property
    def nbytes(self) -> int:
        return self.length * self.bytes_per_token

    def copy(self) -> FakeKV:
        return FakeKV(self.length, self.bytes_per_token)

    def __repr__(self) -> str:
        return f"FakeKV(tokens={self.length}, nbytes={self.nbytes})"


class SimulatedEngine:
    """The engine's cache behaviour without a model: the tokenizer and context prompt assembly reads
    (``cached_prefix_length`` is the probe of the ``cache`` chunk order) plus ``serve``."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        model_id: str,
        max_context: int,
        config: EngineConfig,
        bytes_per_token: int,
    ) -> None:
        if bytes_per_token <= 0:
            raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.max_context = max_context
        self.config = config
        self.bytes_per_token = bytes_per_token
        self.caching = config.enable_prefix_cache and config.cache_bytes > 0
        self.cache = RadixCache.from_config(config.cache_config())

    def cached_prefix_length(self, token_ids: Sequence[int], namespace: str = "") -> int:
        """How many leading tokens the cache holds (no side effects), as ``Engine`` answers it."""
        if not self.caching:
            return 0
        return int(self.cache.peek_length(list(token_ids), namespace=self._namespace(namespace)))

    def serve(self, token_ids: Sequence[int], namespace: str = "") -> int:
        """One request with one output token; returns the cached tokens the engine would reuse."""
        ids = list(token_ids)
        if not self.caching or not ids:
            return 0
        ns = self._namespace(namespace)
        match = self.cache.match_prefix(ids, namespace=ns, max_length=len(ids) - 1)
        self.cache.lock(match.node)
        try:
            kv = FakeKV(len(ids), self.bytes_per_token)
            self.cache.insert(ids, kv, namespace=ns)  # at the end: prompt + (no fed) completion tokens
        finally:
            self.cache.unlock(match.node)
        return match.length

    def stream(
        self,
        prompt: Any,
        params: SamplingParams | None = None,
        *,
        namespace: str = "",
        reuse: Any = None,
        chunk_spans: Sequence[tuple[int, int]] | None = None,
        chunk_context: Sequence[int] | None = None,
    ) -> Iterator[StreamEvent]:
        raise NotImplementedError("SimulatedEngine has no model: use serve() for cache behaviour")

    def _namespace(self, tenant: str) -> str:
        return f"{self.model_id}{NAMESPACE_SEP}{tenant}"
