"""EngineConfig: every engine knob in one validated model."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.chunks.reuse import (
    DEFAULT_SELECT_LAYER,
    DEFAULT_SHARE,
    DEFAULT_STRATEGY,
    ChunkReuse,
    RecomputeStrategy,
    ReuseMode,
)
from engine.dtype import DType
from engine.kv.codec import KVDType
from engine.models import DEFAULT_MODEL
from prefix_cache import CacheConfig
from prefix_cache.eviction import DEFAULT_ATTENTION_WINDOW

REDIS_SCHEMES = ("redis", "rediss", "unix")  # what the redis client connects to
WeightsFormat = Literal["float32", "int8"]


class EngineConfig(BaseModel):
    """Engine settings (the API layer nests this in its Settings).

    Example:
        >>> EngineConfig(cache_bytes=256 << 20, dtype="bfloat16").dtype
        'bfloat16'
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = DEFAULT_MODEL
    dtype: DType = Field(
        default="auto",
        description="compute dtype: 'auto' (bfloat16 where the CPU has AMX-BF16 or AVX512-BF16, else "
        "float32; engine.stats()['dtype'] says which and why), 'float32' or 'bfloat16'",
    )
    cache_bytes: int = Field(
        default=1 << 30, ge=0, description="prefix-cache byte budget; 0 disables caching"
    )
    enable_prefix_cache: bool = True
    saved_logits: int = Field(
        default=64,
        ge=0,
        description="prompts whose last-position logits are kept after an exact prefill (one float32 "
        "per vocabulary entry each), so a request whose whole prompt is cached computes none of it; 0: "
        "off, the last token is always computed again",
    )
    page_size: int = Field(default=1, ge=1)
    eviction: Literal["lru", "gdsf"] = "lru"
    gdsf_attention_window: float = Field(
        default=DEFAULT_ATTENTION_WINDOW,
        gt=0,
        description="eviction='gdsf': the context length (tokens) at which a token's attention costs as "
        "much as its weight matmuls; deeper prefixes count as costlier to recompute",
    )
    runner: Literal["auto", "fast", "hf"] = Field(
        default="auto",
        description="'fast': fused Llama-family runner with batched decode; 'hf': transformers forward",
    )
    batch_invariant: bool = Field(
        default=False,
        description="fused runner: decode runs a prefill's shapes, so a token's result never depends on "
        "what else is batched with it (greedy output under load equals sequential output, bit for bit) "
        "and a decoded answer's KV equals a prefill's (a follow-up turn that reuses it is exact), at a "
        "slower single-stream decode; off (vLLM's and SGLang's default): batched decode and reused "
        "answers may round differently. Reuse of prompt KV is exact either way where the engine states "
        "exact_reuse (engine/prefill_shapes.py, engine/exact_reuse.py)",
    )
    exact_shapes: bool = Field(
        default=True,
        description="fused runner: every prefill matmul and attention call runs the calibrated row "
        "tiles that make a token's result independent of how its prompt was split (engine/row_tiles.py); "
        "False runs each in one call of whatever size, whose rounding then depends on the split on "
        "some CPUs (exact_reuse says so). The benchmark measures what the tiles cost",
    )
    native_decode: bool = Field(
        default=True,
        description="fused runner in bfloat16 on a CPU with AVX512-BF16: each decode step runs every layer "
        "in one native call (engine/native/decode.py, compiled once per machine with g++); its results "
        "are close to the layer loop's, and a row never depends on its batch mates. stats()['decode'] "
        "says which step runs and why; False: the layer loop",
    )
    check_exact_reuse: bool = Field(
        default=True,
        description="at load, check that reusing cached KV gives the same bits as computing it on this "
        "machine (a seeded prompt computed whole and split; under a second for the bundled model) and "
        "state the verdict as exact_reuse in stats(); False skips the check (exact_reuse: null)",
    )
    prefill_chunk_tokens: int = Field(
        default=1024,
        ge=16,
        description="prefill long prompts in chunks; cancellation takes effect between them",
    )
    mixed_prefill_tokens: int = Field(
        default=1024,
        ge=16,
        description="while other requests decode, each engine step prefills at most this many prompt "
        "tokens, of one waiting prompt or several, between two of their decode steps (continuous "
        "batching): a long prompt delays a running stream's next token by one step's budget, never by "
        "the whole prompt's, and short prompts that arrive together start in one step",
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
    kv_dtype: KVDType = Field(
        default="float32",
        description="how the prefix cache (RAM and disk) stores K/V: 'float32' (the model's own "
        "precision, no rounding), 'bfloat16' or 'float16' (half the bytes), 'int8' (a quarter, with a "
        "scale per token and head). The model rounds every K/V it computes to this format before "
        "attention, so cached output equals uncached output for each choice; the fidelity of each "
        "to float32 KV is measured in the benchmark",
    )
    disk_cache_dir: Path | None = Field(
        default=None,
        description="directory of the disk KV tier under the RAM cache (None: off). Survives restarts "
        "and may be shared by several engines of the same model (replicas)",
    )
    disk_cache_bytes: int = Field(
        default=8 << 30,
        ge=0,
        description="byte budget of the disk tier (least recently used blocks go first); 0 disables it",
    )
    remote_cache_url: str | None = Field(
        default=None,
        description="redis://[user:password@]host:port/db (or rediss://, unix://) of the remote KV tier "
        "under the disk tier (None: off). Engines of one model on every host that name the same Redis "
        "share their KV blocks; Redis's own eviction bounds it (maxmemory with maxmemory-policy "
        "allkeys-lru)",
    )
    remote_cache_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=30,
        description="bound on every call to the remote tier (connect, read, write); a slower or failed "
        "call is a miss, and the tier is skipped for a while before it is tried again",
    )

    @field_validator("remote_cache_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        if not url:  # unset, or set empty (PREFIXRAG_ENGINE__REMOTE_CACHE_URL=): off
            return None
        if urlsplit(url).scheme not in REDIS_SCHEMES:
            raise ValueError(
                f"remote_cache_url must start with one of {', '.join(s + '://' for s in REDIS_SCHEMES)}"
            )
        return url

    def cache_config(self) -> CacheConfig:
        """The prefix cache's settings (budget, page size, eviction policy and its parameters).

        >>> EngineConfig(cache_bytes=1 << 20, eviction="gdsf").cache_config().eviction
        'gdsf'
        """
        return CacheConfig(
            capacity_bytes=self.cache_bytes,
            page_size=self.page_size,
            eviction=self.eviction,
            attention_window=self.gdsf_attention_window,
        )

    weights: WeightsFormat = Field(
        default="float32",
        description="Linear and lm_head weights. 'int8' (fused runner only): per-output-channel int8 "
        "weights times per-token int8 activations on fbgemm, converted once and cached under "
        "$PREFIXRAG_HOME; a token's result depends on that token alone, so batched decode equals solo "
        "decode and reuse of cached KV is as exact as the attention's. Approximate against float32 "
        "(measured in the benchmark report)",
    )

    @model_validator(mode="after")
    def _int8_needs_fused_runner(self) -> EngineConfig:
        if self.weights == "int8" and self.runner == "hf":
            raise ValueError("weights='int8' runs on the fused runner only; use runner='auto' or 'fast'")
        return self

    reuse: ReuseMode = Field(
        default="prefix",
        description="'prefix': reuse the longest cached prefix (exact); 'chunks': also reuse every cached "
        "retrieved chunk wherever it stands (approximate, see chunk_recompute; requests pass chunk_spans). "
        "Requests may override it",
    )
    chunk_recompute: RecomputeStrategy = Field(
        default=DEFAULT_STRATEGY,
        description="chunks mode: which reused chunk tokens are recomputed so chunks see each other: "
        "'none', 'boundary' (each chunk's first token), 'first' (each chunk's first tokens), 'edges' (its "
        "first and last), 'tail' (the tokens nearest the question), 'first_tail' (half each), 'deviation' "
        "(CacheBlend: most deviating K/V), 'query' (what the question attends to most); see "
        "engine.chunks.reuse.ChunkReuse",
    )
    chunk_recompute_share: float = Field(
        default=DEFAULT_SHARE, ge=0, le=1, description="chunks mode: share of reused chunk tokens recomputed"
    )
    chunk_select_layer: int = Field(
        default=DEFAULT_SELECT_LAYER,
        ge=1,
        validation_alias=AliasChoices("chunk_select_layer", "chunk_deviation_layer"),
        description="chunks mode, 'deviation' and 'query': the layer whose K/V deviation or question "
        "attention selects the tokens (also where the deviation estimate is read); formerly "
        "chunk_deviation_layer, still accepted",
    )

    def chunk_reuse(self) -> ChunkReuse:
        """The recompute settings chunks-mode requests get unless they bring their own."""
        return ChunkReuse(self.chunk_recompute, self.chunk_recompute_share, self.chunk_select_layer)
