"""EngineConfig: every engine knob in one validated model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.models import DEFAULT_MODEL
from engine.reuse import (
    DEFAULT_DEVIATION_LAYER,
    DEFAULT_SHARE,
    DEFAULT_STRATEGY,
    ChunkReuse,
    RecomputeStrategy,
    ReuseMode,
)


class EngineConfig(BaseModel):
    """Engine settings (the API layer nests this in its Settings).

    Example:
        >>> EngineConfig(cache_bytes=256 << 20, dtype="bfloat16").dtype
        'bfloat16'
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = DEFAULT_MODEL
    dtype: Literal["float32", "bfloat16"] = "float32"
    cache_bytes: int = Field(
        default=1 << 30, ge=0, description="prefix-cache byte budget; 0 disables caching"
    )
    enable_prefix_cache: bool = True
    page_size: int = Field(default=1, ge=1)
    eviction: Literal["lru", "gdsf"] = "lru"
    runner: Literal["auto", "fast", "hf"] = Field(
        default="auto",
        description="'fast': fused Llama-family runner with batched decode; 'hf': transformers forward",
    )
    batch_invariant: bool = Field(
        default=False,
        description="fused runner: a request's decode never depends on what else is batched with it "
        "(greedy output under load equals sequential output, bit for bit) at a slower single-stream "
        "decode; off (vLLM's and SGLang's default): batched decode may round differently. "
        "Cache reuse is exact either way (prefill rows are always padded)",
    )
    prefill_chunk_tokens: int = Field(
        default=1024,
        ge=16,
        description="prefill long prompts in chunks; cancellation takes effect between them",
    )
    max_waiting: int = Field(default=256, ge=1, description="bounded queue; more raises QueueFullError")
    max_running: int = Field(
        default=8, ge=1, description="requests decoding concurrently (batched on 'fast')"
    )
    buffer_pool_bytes: int = Field(
        default=512 << 20,
        ge=0,
        description="KV storage of finished requests kept for the next ones (a fresh buffer's pages fault "
        "in on first touch, which slows prefix loads); 0 disables",
    )
    kv_slab_bytes: int = Field(
        default=64 << 20,
        ge=0,
        description="the prefix cache's KV blocks come from slabs of this size, recycled on eviction "
        "(blocks allocated one by one fragment the heap and the next prefill page-faults); "
        "0: allocate each block on its own",
    )
    idle_trim_s: float | None = Field(
        default=5.0,
        ge=0,
        description="seconds idle after serving before freed heap goes back to the OS (RSS stays flat "
        "after load); the next prefill faults that memory in again, so not between requests that "
        "follow each other closely. None: never",
    )
    aging_rate: float = Field(default=2000.0, ge=0, description="tokens of priority gained per second waited")
    num_threads: int | None = Field(
        default=None, ge=1, description="torch intra-op threads (default: all cores)"
    )
    reuse: ReuseMode = Field(
        default="prefix",
        description="'prefix': reuse the longest cached prefix (exact); 'chunks': also reuse every cached "
        "retrieved chunk wherever it stands (approximate, see chunk_recompute; requests pass chunk_spans). "
        "Requests may override it",
    )
    chunk_recompute: RecomputeStrategy = Field(
        default=DEFAULT_STRATEGY,
        description="chunks mode: which reused chunk tokens are recomputed so chunks see each other: "
        "'none', 'first' (each chunk's first tokens), 'deviation' (CacheBlend: most deviating K/V)",
    )
    chunk_recompute_share: float = Field(
        default=DEFAULT_SHARE, ge=0, le=1, description="chunks mode: share of reused chunk tokens recomputed"
    )
    chunk_deviation_layer: int = Field(
        default=DEFAULT_DEVIATION_LAYER,
        ge=1,
        description="chunks mode, 'deviation': the layer whose K/V deviation selects the tokens "
        "(layers below it are recomputed for every chunk token)",
    )

    def chunk_reuse(self) -> ChunkReuse:
        """The recompute settings chunks-mode requests get unless they bring their own."""
        return ChunkReuse(self.chunk_recompute, self.chunk_recompute_share, self.chunk_deviation_layer)
