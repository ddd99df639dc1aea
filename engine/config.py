"""EngineConfig: every engine knob in one validated model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.models import DEFAULT_MODEL

WeightsFormat = Literal["float32", "int8"]


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
