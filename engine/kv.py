"""KV state: the segment type the prefix cache stores, and the per-request buffer the model writes into.

Two conversions matter and both are one copy per segment for all layers at once:
  cached segments ──KVBuffer.load_prefix──► a transformers ``Cache`` the forward pass extends in place
  the forward pass's buffer ──KVBuffer.segment(start, end)──► a KVSegment *view* the cache copies from
No ``torch.cat`` per layer and no regrowth per decode step (transformers' DynamicCache concatenates the
whole history on every step, which costs O(context) per token).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from engine.block_pool import KVBlockPool, Slot

BLOCK_TOKENS = 64  # granularity of cache-owned KV: a radix split copies at most one block


class _Block:
    """Keys/values for a run of tokens. ``owned``: an immutable tensor the cache may share on a split.
    ``slot``: the pool slot the tensors live in (views of a pooled block hold it too, so the slot is
    not reused while any of them lives)."""

    __slots__ = ("keys", "owned", "slot", "values")

    def __init__(
        self, keys: torch.Tensor, values: torch.Tensor, owned: bool, slot: Slot | None = None
    ) -> None:
        self.keys = keys
        self.values = values
        self.owned = owned
        self.slot = slot

    def __len__(self) -> int:
        return int(self.keys.shape[2])


class KVSegment:
    """Per-layer keys and values for a span of tokens; sliceable along tokens like a numpy array.

    Layout of each part: ``keys [layers, kv_heads, n, head_dim_k]``, ``values [layers, kv_heads, n,
    head_dim_v]``. A segment is a list of blocks: slicing returns views, and ``copy()`` (what the
    radix cache calls on everything it keeps) copies view data into compact blocks of up to
    ``BLOCK_TOKENS`` tokens but *shares* blocks that are already cache-owned and whole. So a radix
    split copies at most one block, never the whole node; no byte is ever held by two live nodes, because a split replaces the node it splits. With a ``pool`` (the
    engine's `KVBlockPool`), whole blocks are copied into pooled slots instead of fresh allocations.

    Example:
        >>> seg = KVSegment(torch.zeros(30, 3, 10, 64), torch.zeros(30, 3, 10, 64))
        >>> len(seg), len(seg[2:5]), seg[2:5].nbytes
        (10, 3, 138240)
    """

    __slots__ = ("blocks", "pool")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, pool: KVBlockPool | None = None) -> None:
        if keys.dim() != 4 or values.dim() != 4 or keys.shape[2] != values.shape[2]:
            raise ValueError(
                f"KVSegment needs [layers, heads, tokens, dim] tensors, got {keys.shape} / {values.shape}"
            )
        self.blocks = [_Block(keys, values, owned=False)]
        self.pool = pool

    @classmethod
    def _of(cls, blocks: list[_Block], pool: KVBlockPool | None) -> KVSegment:
        seg = cls.__new__(cls)
        seg.blocks = blocks
        seg.pool = pool
        return seg

    def __len__(self) -> int:
        return sum(len(b) for b in self.blocks)

    def __getitem__(self, index: slice) -> KVSegment:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("KVSegment supports contiguous slices only")
        start, stop, _ = index.indices(len(self))
        out: list[_Block] = []
        pos = 0
        for block in self.blocks:
            n = len(block)
            lo, hi = max(start - pos, 0), min(stop - pos, n)
            if lo < hi:
                if lo == 0 and hi == n:
                    out.append(block)  # whole block: keeps its ownership
                else:
                    keys, values = block.keys[:, :, lo:hi], block.values[:, :, lo:hi]
                    out.append(_Block(keys, values, owned=False, slot=block.slot))
            pos += n
            if pos >= stop:
                break
        return KVSegment._of(out, self.pool)

    @property
    def nbytes(self) -> int:
        return sum(
            b.keys.numel() * b.keys.element_size() + b.values.numel() * b.values.element_size()
            for b in self.blocks
        )

    @property
    def keys(self) -> torch.Tensor:
        """All keys as one tensor (for inspection and tests)."""
        return self._whole([b.keys for b in self.blocks])

    @property
    def values(self) -> torch.Tensor:
        return self._whole([b.values for b in self.blocks])

    def _whole(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """A copy, unless the segment is one unpooled block (a pooled slot is reused once its blocks go)."""
        return parts[0] if len(parts) == 1 and self.blocks[0].slot is None else torch.cat(parts, 2)

    def copy(self) -> KVSegment:
        """A segment that owns its memory: views are copied into compact blocks, owned blocks shared."""
        out: list[_Block] = []
        for block in self.blocks:
            if block.owned:
                out.append(block)
                continue
            for a in range(0, len(block), BLOCK_TOKENS):
                b = min(a + BLOCK_TOKENS, len(block))
                out.append(self._owned_copy(block.keys[:, :, a:b], block.values[:, :, a:b]))
        return KVSegment._of(out, self.pool)

    def _owned_copy(self, keys: torch.Tensor, values: torch.Tensor) -> _Block:
        slot = self.pool.take(keys, values) if self.pool is not None else None
        if slot is None:  # no pool, or a partial block: a compact allocation of its own
            keys = keys.clone(memory_format=torch.contiguous_format)
            values = values.clone(memory_format=torch.contiguous_format)
            return _Block(keys, values, owned=True)
        slot.keys.copy_(keys)
        slot.values.copy_(values)
        return _Block(slot.keys, slot.values, owned=True, slot=slot)

    @staticmethod
    def concat(segments: Sequence[KVSegment]) -> KVSegment:
        if not segments:
            raise ValueError("cannot concatenate zero segments")
        pool = next((s.pool for s in segments if s.pool is not None), None)
        return KVSegment._of([b for s in segments for b in s.blocks], pool)

    def parts(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (keys, values) tensors of each block, in token order."""
        return [(b.keys, b.values) for b in self.blocks]

    def __repr__(self) -> str:
        return f"KVSegment(tokens={len(self)}, blocks={len(self.blocks)}, nbytes={self.nbytes})"


class _BufferLayer(DynamicLayer):
    """One layer's view into the shared KVBuffer storage; ``update`` writes in place."""

    def __init__(self, owner: KVBuffer, index: int) -> None:
        super().__init__()
        self.owner = owner
        self.index = index

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.owner._ensure_storage(key_states, value_states)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        owner = self.owner
        if owner.k_store is None:
            owner._ensure_storage(key_states, value_states)
        start = owner.layer_lengths[self.index]
        end = start + key_states.shape[-2]
        owner._reserve(end)
        assert owner.k_store is not None and owner.v_store is not None
        owner.k_store[self.index, :, :, start:end].copy_(key_states)
        owner.v_store[self.index, :, :, start:end].copy_(value_states)
        owner.layer_lengths[self.index] = end
        self.keys = owner.k_store[self.index, :, :, :end]
        self.values = owner.v_store[self.index, :, :, :end]
        self.is_initialized = True
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.owner.layer_lengths[self.index]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


class KVBuffer(Cache):
    """A transformers ``Cache`` backed by one preallocated tensor for all layers (batch size 1).

    ``capacity`` tokens are allocated up front (grown by doubling if exceeded); the forward pass appends
    in place and attention reads views ``[:, :, :n]``.

    Example:
        >>> buf = KVBuffer(num_layers=30, capacity=2048)
        >>> buf.load_prefix([seg1, seg2])                     # doctest: +SKIP
        >>> model(input_ids=suffix, past_key_values=buf)      # doctest: +SKIP
        >>> new_part = buf.segment(buf.length - 5, buf.length)  # doctest: +SKIP
    """

    def __init__(self, num_layers: int, capacity: int) -> None:
        self.num_layers = num_layers
        self.capacity = max(int(capacity), 1)
        self.layer_lengths = [0] * num_layers
        self.k_store: torch.Tensor | None = None  # [layers, 1, heads, capacity, dim]
        self.v_store: torch.Tensor | None = None
        super().__init__(layers=[_BufferLayer(self, i) for i in range(num_layers)])

    @property
    def length(self) -> int:
        """Tokens held (all layers agree between forward passes)."""
        return self.layer_lengths[0]

    def ensure_storage(
        self, heads: int, head_dim: int, dtype: torch.dtype, device: Any = "cpu", value_dim: int | None = None
    ) -> None:
        """Allocate the storage on first use (shapes come from the model)."""
        if self.k_store is not None:
            return
        shape = (self.num_layers, 1, heads, self.capacity)
        self.k_store = torch.empty(*shape, head_dim, dtype=dtype, device=device)
        self.v_store = torch.empty(*shape, value_dim or head_dim, dtype=dtype, device=device)

    def adopt_storage(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Use existing ``[layers, 1, heads, capacity, dim]`` storage (recycled from a finished request;
        its contents are ignored) instead of allocating on first use."""
        if self.k_store is not None or self.length:
            raise ValueError("adopt_storage needs a buffer without storage")
        if keys.dim() != 5 or keys.shape[:4] != values.shape[:4] or keys.shape[0] != self.num_layers:
            raise ValueError(
                f"storage for {self.num_layers} layers needs matching 5-d tensors, got {keys.shape}"
            )
        self.k_store, self.v_store, self.capacity = keys, values, int(keys.shape[3])

    def _ensure_storage(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.ensure_storage(keys.shape[1], keys.shape[-1], keys.dtype, keys.device, values.shape[-1])

    def stores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The raw ``[layers, 1, heads, capacity, dim]`` key and value storage (for fused runners)."""
        assert self.k_store is not None and self.v_store is not None, "storage not allocated"
        return self.k_store, self.v_store

    def reserve(self, tokens: int) -> None:
        """Make room for ``tokens`` in total (grows by doubling, keeping what is held)."""
        self._reserve(tokens)

    def set_length(self, tokens: int) -> None:
        """Declare all layers filled up to ``tokens`` (a fused runner writes storage directly)."""
        if tokens > self.capacity:
            raise ValueError(f"length {tokens} exceeds capacity {self.capacity}")
        self._rebind(tokens)

    def _rebind(self, tokens: int) -> None:
        for layer in self.layers:
            assert isinstance(layer, _BufferLayer)
            self.layer_lengths[layer.index] = tokens
            if self.k_store is not None and self.v_store is not None:
                layer.keys = self.k_store[layer.index, :, :, :tokens]
                layer.values = self.v_store[layer.index, :, :, :tokens]
                layer.is_initialized = True

    def _reserve(self, tokens: int) -> None:
        if tokens <= self.capacity:
            return
        assert self.k_store is not None and self.v_store is not None
        new_cap = max(tokens, 2 * self.capacity)
        k = self.k_store.new_empty(*self.k_store.shape[:3], new_cap, self.k_store.shape[4])
        v = self.v_store.new_empty(*self.v_store.shape[:3], new_cap, self.v_store.shape[4])
        held = max(self.layer_lengths)
        k[:, :, :, :held].copy_(self.k_store[:, :, :, :held])
        v[:, :, :, :held].copy_(self.v_store[:, :, :, :held])
        self.k_store, self.v_store, self.capacity = k, v, new_cap
        for layer in self.layers:
            assert isinstance(layer, _BufferLayer)
            n = self.layer_lengths[layer.index]
            layer.keys, layer.values = k[layer.index, :, :, :n], v[layer.index, :, :, :n]

    @torch.inference_mode()  # storage made in a forward (or recycled from one) is an inference tensor
    def load_prefix(self, segments: Sequence[KVSegment], start: int = 0) -> int:
        """Copy cached segments (in order) into the buffer from token ``start`` on (the buffer must hold
        exactly ``start`` tokens; 0: an empty buffer); returns the tokens loaded."""
        if self.length != start:
            raise ValueError(
                f"load_prefix at {start} needs a buffer holding {start} tokens, not {self.length}"
            )
        total = sum(len(s) for s in segments)
        if total == 0:
            return 0
        keys0, values0 = segments[0].parts()[0]
        # [layers, heads, n, dim] -> storage takes [heads, n, dim] per layer with a batch axis of 1
        self._ensure_storage(keys0[0:1], values0[0:1])
        self._reserve(start + total)
        assert self.k_store is not None and self.v_store is not None
        pos = start
        for seg in segments:
            for keys, values in seg.parts():
                n = keys.shape[2]
                self.k_store[:, 0, :, pos : pos + n].copy_(keys)  # one copy per block for all layers
                self.v_store[:, 0, :, pos : pos + n].copy_(values)
                pos += n
        self._rebind(start + total)
        return total

    def segment(self, start: int, end: int, pool: KVBlockPool | None = None) -> KVSegment:
        """A view of tokens [start, end) for all layers (the cache copies what it keeps, into ``pool``'s
        slots when given)."""
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"segment [{start}, {end}) outside the buffer's {self.length} tokens")
        assert self.k_store is not None and self.v_store is not None
        return KVSegment(self.k_store[:, 0, :, start:end], self.v_store[:, 0, :, start:end], pool)

    def truncate(self, length: int) -> None:
        """Forget tokens past ``length`` (e.g. a rejected draft); storage is kept."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate {self.length} tokens to {length}")
        self._rebind(length)

    @property
    def nbytes(self) -> int:
        if self.k_store is None or self.v_store is None:
            return 0
        return (
            self.k_store.numel() * self.k_store.element_size()
            + self.v_store.numel() * self.v_store.element_size()
        )
