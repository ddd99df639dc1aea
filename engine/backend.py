"""What a caller may ask of a generation backend: the calls every backend answers, and the optional
ones each backend states in its ``capabilities``.

``Engine`` (a model in this process) and ``RemoteEngine`` (an OpenAI-compatible server) are the two
backends. Callers (``rag.Pipeline``, ``rag.warming``, the API) read ``backend.capabilities`` and then
use the protocol that capability names; they never look for methods or read signatures.

Example:
    >>> caps = BackendCapabilities(prefix_probe=True, public_prefix=True)
    >>> caps.chunk_reuse, caps.local_cache
    (False, False)
    >>> probe = cache_probe(engine)                      # doctest: +SKIP
    >>> probe.cached_prefix_length(ids, "alice") if probe else 0   # doctest: +SKIP
    412
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from engine.chunks.reuse import ChunkReuse
from engine.encoding import PromptInput
from engine.request import GenerationResult, StreamEvent
from engine.sampling import SamplingParams
from prefix_cache import RadixCache

if TYPE_CHECKING:
    from engine.warm import WarmResult


TIER_FLUSH_TIMEOUT_S = 600.0  # how long a warm-up waits for the tiers under RAM to hold its blocks


@dataclass(frozen=True)
class BackendCapabilities:
    """The optional parts of the backend protocol a backend implements.

    ``prefix_probe``: it reads its own prefix cache without side effects (``CacheProbe``), so a chunk
    order can follow what is cached. ``public_prefix``: ``stream(public_prefix=n)`` shares a vouched-public
    prefix across tenants (otherwise it must be 0). ``chunk_reuse``: ``reuse="chunks"`` stitches cached
    chunks (otherwise such a request is refused or served as ``"prefix"``). ``local_cache``: the cache lives
    in this process and can be reset, warmed and flushed (``LocalCache``).
    """

    prefix_probe: bool = False
    public_prefix: bool = False
    chunk_reuse: bool = False
    local_cache: bool = False


class EventStream(Iterator[StreamEvent], Protocol):
    """A request's events: text deltas, the last one carrying the result. ``close()`` (also before the
    first event) cancels the request."""

    def close(self) -> None: ...


class GenerationBackend(Protocol):
    """What every backend answers: generation, its tokenizer and limits, its stats."""

    model_id: str

    @property
    def capabilities(self) -> BackendCapabilities: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def max_context(self) -> int | None: ...

    def encode(self, prompt: PromptInput) -> list[int]: ...

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
    ) -> EventStream: ...

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
    ) -> GenerationResult: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@runtime_checkable
class CacheProbe(Protocol):
    """``capabilities.prefix_probe``: questions about the backend's own prefix cache, answered without
    changing it."""

    def cached_prefix_length(
        self, token_ids: Sequence[int], namespace: str = "", *, public: bool = False
    ) -> int: ...

    def free_cache_tokens(self) -> int: ...


@runtime_checkable
class LocalCache(CacheProbe, Protocol):
    """``capabilities.local_cache``: a prefix cache in this process (RAM, and the tiers under it)."""

    caching: bool
    cache: RadixCache

    def reset_cache(self) -> None: ...

    def warm(
        self,
        prompts: Sequence[PromptInput],
        *,
        namespace: str = "",
        progress: Callable[[int, int], None] | None = None,
    ) -> WarmResult: ...

    def flush_tiers(self, timeout_s: float = TIER_FLUSH_TIMEOUT_S) -> bool | None: ...


def cache_probe(backend: GenerationBackend) -> CacheProbe | None:
    """The backend as a ``CacheProbe`` when it states ``prefix_probe`` (None otherwise)."""
    return cast(CacheProbe, backend) if backend.capabilities.prefix_probe else None


def local_cache(backend: GenerationBackend) -> LocalCache | None:
    """The backend as a ``LocalCache`` when it states ``local_cache`` (None otherwise)."""
    return cast(LocalCache, backend) if backend.capabilities.local_cache else None
