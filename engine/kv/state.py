"""KV state: the segment type the prefix cache stores, and the per-request buffer the model writes into.

Two conversions matter and both are one copy per segment for all layers at once:
  cached segments ──KVBuffer.load_prefix──► a transformers ``Cache`` the forward pass extends in place
  the forward pass's buffer ──KVBuffer.segment(start, end)──► a KVSegment *view* the cache copies from
No ``torch.cat`` per layer and no regrowth per decode step (transformers' DynamicCache concatenates the
whole history on every step, which costs O(context) per token).

The buffer holds KV in the compute dtype (``raw``); the cache's blocks hold it in the engine's storage
format (``stored``, engine.kv.codec). Loading decodes, copying into the cache encodes, and the model
rounds every K/V it writes through the format, so both directions are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from engine.kv.block_pool import KVBlockPool, Slot
from engine.kv.codec import KVCodec, identity_codec
from engine.prefill_shapes import round_up

BLOCK_TOKENS = 64  # granularity of cache-owned KV: a radix split copies at most one block


class _Block:
    """Keys/values for a run of tokens. ``owned``: an immutable tensor the cache may share on a split.
    ``slot``: the pool slot the tensors live in (views of a pooled block hold it too, so the slot is
    not reused while any of them lives). ``stored``: the tensors are in the codec's stored form (else
    raw: views of a request's buffer)."""

    __slots__ = ("keys", "owned", "slot", "stored", "values")

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        owned: bool,
        slot: Slot | None = None,
        stored: bool = False,
    ) -> None:
        self.keys = keys
        self.values = values
        self.owned = owned
        self.slot = slot
        self.stored = stored

    def __len__(self) -> int:
        return int(self.keys.shape[2])


class KVSegment:
    """Per-layer keys and values for a span of tokens; sliceable along tokens like a numpy array.

    Layout of each part: ``keys [layers, kv_heads, n, head_dim_k]``, ``values [layers, kv_heads, n,
    head_dim_v]``. A segment is a list of blocks: slicing returns views, and ``copy()`` (what the
    radix cache calls on everything it keeps) copies view data into compact blocks of up to
    ``BLOCK_TOKENS`` tokens but *shares* blocks that are already cache-owned and whole. So a radix
    split copies at most one block, never the whole node; no byte is ever held by two live nodes,
    because a split replaces the node it splits. With a ``pool`` (the engine's `KVBlockPool`), whole
    blocks are copied into pooled slots instead of fresh allocations.

    ``codec`` is the storage format (engine.kv.codec; default: the tensors' own dtype): ``copy()``
    encodes raw views into it, ``nbytes`` counts stored bytes, and ``keys``/``values``/``parts()``/
    ``decoded()`` give raw (compute-dtype) tensors whatever the format; ``stored_parts()`` gives the
    stored ones.

    Example:
        >>> seg = KVSegment(torch.zeros(30, 3, 10, 64), torch.zeros(30, 3, 10, 64))
        >>> len(seg), len(seg[2:5]), seg[2:5].nbytes
        (10, 3, 138240)
    """

    __slots__ = ("blocks", "codec", "pool")

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        pool: KVBlockPool | None = None,
        codec: KVCodec | None = None,
    ) -> None:
        _check_shapes(keys, values)
        self.blocks = [_Block(keys, values, owned=False)]
        self.pool = pool
        self.codec = codec or identity_codec(keys.dtype)

    @classmethod
    def from_stored(
        cls, keys: torch.Tensor, values: torch.Tensor, codec: KVCodec, pool: KVBlockPool | None = None
    ) -> KVSegment:
        """A segment over tensors already in ``codec``'s stored form (e.g. read from disk)."""
        _check_shapes(keys, values)
        if keys.dtype != codec.stored_dtype or values.dtype != codec.stored_dtype:
            raise ValueError(f"stored {codec.name} KV must be {codec.stored_dtype}, got {keys.dtype}")
        return cls._of([_Block(keys, values, owned=False, stored=True)], pool, codec)

    @classmethod
    def _of(cls, blocks: list[_Block], pool: KVBlockPool | None, codec: KVCodec) -> KVSegment:
        seg = cls.__new__(cls)
        seg.blocks = blocks
        seg.pool = pool
        seg.codec = codec
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
                    out.append(_Block(keys, values, owned=False, slot=block.slot, stored=block.stored))
            pos += n
            if pos >= stop:
                break
        return KVSegment._of(out, self.pool, self.codec)

    @property
    def nbytes(self) -> int:
        """Bytes the segment takes in the cache (its stored form, also for raw views)."""
        return sum(self._block_nbytes(b) for b in self.blocks)

    def _block_nbytes(self, block: _Block) -> int:
        if block.stored or self.codec.identity:
            return _nbytes(block.keys) + _nbytes(block.values)
        size = torch.empty(0, dtype=self.codec.stored_dtype).element_size()
        k, v = block.keys.shape, block.values.shape
        per_token = k[0] * k[1] * self.codec.stored_dim(k[3]) + v[0] * v[1] * self.codec.stored_dim(v[3])
        return per_token * k[2] * size

    @property
    def keys(self) -> torch.Tensor:
        """All keys as one raw tensor (for inspection and tests)."""
        return self.decoded()[0]

    @property
    def values(self) -> torch.Tensor:
        return self.decoded()[1]

    def decoded(self, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """All keys and values as raw tensors, in ``dtype`` (default: the compute dtype). A copy, unless
        the segment is one unpooled block already in that form."""
        parts = self.parts()
        if len(parts) == 1 and self.blocks[0].slot is None and (dtype is None or parts[0][0].dtype == dtype):
            return parts[0]
        keys, values = torch.cat([k for k, _ in parts], 2), torch.cat([v for _, v in parts], 2)
        return (keys, values) if dtype is None else (keys.to(dtype), values.to(dtype))

    def parts(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The raw (keys, values) tensors of each block, in token order (decoded copies for a codec
        that is not the identity)."""
        return [(self._raw(b.keys, b.stored), self._raw(b.values, b.stored)) for b in self.blocks]

    def stored_parts(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The stored-form (keys, values) tensors of each block, in token order."""
        return [(self._stored(b.keys, b.stored), self._stored(b.values, b.stored)) for b in self.blocks]

    def _raw(self, x: torch.Tensor, stored: bool) -> torch.Tensor:
        return self.codec.decode(x) if stored and not self.codec.identity else x

    def _stored(self, x: torch.Tensor, stored: bool) -> torch.Tensor:
        return x if stored or self.codec.identity else self.codec.encode(x)

    def copy(self) -> KVSegment:
        """A segment that owns its memory, in the stored form: views are copied (raw ones encoded) into
        compact blocks, owned blocks shared."""
        out: list[_Block] = []
        for block in self.blocks:
            if block.owned:
                out.append(block)
                continue
            for a in range(0, len(block), BLOCK_TOKENS):
                b = min(a + BLOCK_TOKENS, len(block))
                out.append(self._owned_copy(block.keys[:, :, a:b], block.values[:, :, a:b], block.stored))
        return KVSegment._of(out, self.pool, self.codec)

    def _owned_copy(self, keys: torch.Tensor, values: torch.Tensor, stored: bool) -> _Block:
        codec = self.codec
        k_shape: tuple[int, ...]
        v_shape: tuple[int, ...]
        if stored or codec.identity:
            k_shape, v_shape = tuple(keys.shape), tuple(values.shape)
        else:
            k_shape = (*keys.shape[:3], codec.stored_dim(keys.shape[3]))
            v_shape = (*values.shape[:3], codec.stored_dim(values.shape[3]))
        slot = None
        if self.pool is not None:
            slot = self.pool.take_shaped(k_shape, v_shape, codec.stored_dtype, keys.device)
        if slot is None:  # no pool, or a partial block: a compact allocation of its own
            k_out = keys.new_empty(k_shape, dtype=codec.stored_dtype)
            v_out = values.new_empty(v_shape, dtype=codec.stored_dtype)
        else:
            k_out, v_out = slot.keys, slot.values
        if stored or codec.identity:
            k_out.copy_(keys)
            v_out.copy_(values)
        else:
            codec.encode_into(k_out, keys)
            codec.encode_into(v_out, values)
        return _Block(k_out, v_out, owned=True, slot=slot, stored=True)

    @staticmethod
    def concat(segments: Sequence[KVSegment]) -> KVSegment:
        if not segments:
            raise ValueError("cannot concatenate zero segments")
        codec = segments[0].codec
        if any(s.codec.name != codec.name for s in segments):
            raise ValueError(
                f"cannot concatenate segments of different KV formats: {[s.codec.name for s in segments]}"
            )
        pool = next((s.pool for s in segments if s.pool is not None), None)
        return KVSegment._of([b for s in segments for b in s.blocks], pool, codec)

    def __repr__(self) -> str:
        return (
            f"KVSegment(tokens={len(self)}, blocks={len(self.blocks)}, nbytes={self.nbytes}, "
            f"kv_dtype={self.codec.name})"
        )


def skip_tokens(segments: Sequence[KVSegment], count: int) -> list[KVSegment]:
    """The segments (in token order) less their first ``count`` tokens in all (views, no copy).

    Example:
        >>> seg = KVSegment(torch.zeros(2, 1, 10, 4), torch.zeros(2, 1, 10, 4))
        >>> [len(s) for s in skip_tokens([seg, seg[:5]], 12)]
        [3]
    """
    out: list[KVSegment] = []
    start = 0
    for seg in segments:
        end = start + len(seg)
        if end > count:
            out.append(seg if start >= count else seg[count - start :])
        start = end
    return out


def _check_shapes(keys: torch.Tensor, values: torch.Tensor) -> None:
    if keys.dim() != 4 or values.dim() != 4 or keys.shape[2] != values.shape[2]:
        raise ValueError(
            f"KVSegment needs [layers, heads, tokens, dim] tensors, got {keys.shape} / {values.shape}"
        )


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def _refuse_assignment(value: torch.Tensor | None) -> None:
    """A buffer layer's keys and values follow its buffer's storage and lengths: transformers'
    constructor sets them to None; anything else (a crop, a reorder) would bypass the lengths."""
    if value is not None:
        raise TypeError(
            "a KVBuffer layer's keys and values are views of its buffer: change the buffer instead"
        )


class _BufferLayer(DynamicLayer):
    """One layer's view into the shared KVBuffer storage; ``update`` writes in place. ``keys`` and
    ``values`` are views of the storage up to the layer's length, made when read: a decode step that
    writes the storage natively moves the lengths alone."""

    def __init__(self, owner: KVBuffer, index: int) -> None:
        self.owner = owner
        self.index = index
        super().__init__()

    def _held(self, store: torch.Tensor | None) -> torch.Tensor | None:
        return None if store is None else store[self.index, :, :, : self.owner.layer_lengths[self.index]]

    @property
    def keys(self) -> torch.Tensor | None:
        return self._held(self.owner.k_store)

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        _refuse_assignment(value)

    @property
    def values(self) -> torch.Tensor | None:
        return self._held(self.owner.v_store)

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        _refuse_assignment(value)

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
        shown = owner.shown_keys(end)
        owner._reserve(shown)
        assert owner.k_store is not None and owner.v_store is not None
        if owner.codec is not None and not owner.codec.identity:  # attention reads what the cache stores
            key_states, value_states = owner.codec.round(key_states), owner.codec.round(value_states)
        owner.k_store[self.index, :, :, start:end].copy_(key_states)
        owner.v_store[self.index, :, :, start:end].copy_(value_states)
        owner.layer_lengths[self.index] = end
        self.is_initialized = True
        if shown == end:
            return owner.k_store[self.index, :, :, :end], owner.v_store[self.index, :, :, :end]
        owner.k_store[self.index, :, :, end:shown] = 0  # read under the mask: must be finite
        owner.v_store[self.index, :, :, end:shown] = 0
        return owner.k_store[self.index, :, :, :shown], owner.v_store[self.index, :, :, :shown]

    def get_seq_length(self) -> int:
        return self.owner.layer_lengths[self.index]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.shown_keys(self.get_seq_length() + query_length), 0

    def get_max_length(self) -> int:
        return -1


class KVBuffer(Cache):
    """A transformers ``Cache`` backed by one preallocated tensor for all layers (batch size 1).

    ``capacity`` tokens are allocated up front (grown by doubling if exceeded); the forward pass appends
    in place and attention reads views ``[:, :, :n]``. ``codec`` (engine.kv.codec) is the cache's KV
    storage format: K/V written through ``update`` are rounded through it, and ``segment`` hands it on.

    Example:
        >>> buf = KVBuffer(num_layers=30, capacity=2048)
        >>> buf.load_prefix([seg1, seg2])                     # doctest: +SKIP
        >>> model(input_ids=suffix, past_key_values=buf)      # doctest: +SKIP
        >>> new_part = buf.segment(buf.length - 5, buf.length)  # doctest: +SKIP
    """

    def __init__(self, num_layers: int, capacity: int, codec: KVCodec | None = None) -> None:
        self.num_layers = num_layers
        self.codec = codec
        self.capacity = max(int(capacity), 1)
        self.layer_lengths = [0] * num_layers
        self.k_store: torch.Tensor | None = None  # [layers, 1, heads, capacity, dim]
        self.v_store: torch.Tensor | None = None
        # attention in a transformers forward reads keys up to a multiple of this (its causal mask
        # hides the extra ones); a runner sets it for prefill, see engine.prefill_shapes
        self.key_align = 1
        super().__init__(layers=[_BufferLayer(self, i) for i in range(num_layers)])

    def shown_keys(self, length: int) -> int:
        """How many keys attention reads when ``length`` are held: rounded up to ``key_align``."""
        return round_up(length, self.key_align)

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
            layer.is_initialized = self.k_store is not None

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

    @torch.inference_mode()  # storage made in a forward (or recycled from one) is an inference tensor
    def load_prefix(self, segments: Sequence[KVSegment], start: int = 0) -> int:
        """Copy cached segments (in order) into the buffer from token ``start`` on (the buffer must hold
        exactly ``start`` tokens; 0: an empty buffer); returns the tokens loaded."""
        if self.length != start:
            raise ValueError(
                f"load_prefix at {start} needs a buffer holding {start} tokens, not {self.length}"
            )
        return self.extend(segments)

    @torch.inference_mode()
    def extend(self, segments: Sequence[KVSegment]) -> int:
        """Append cached segments (in order) after what the buffer holds, decoding stored blocks straight
        into the storage; returns the tokens added."""
        total = sum(len(s) for s in segments)
        if total == 0:
            return 0
        start = self.length
        self._ensure_storage_for(segments[0])
        self._reserve(start + total)
        pos = start
        for seg in segments:
            self._write(pos, seg)
            pos += len(seg)
        self._rebind(start + total)
        return total

    @torch.inference_mode()
    def write_at(self, pos: int, seg: KVSegment) -> None:
        """Decode ``seg`` into tokens [pos, pos + len(seg)) without changing the length: several threads
        may fill disjoint ranges (``ensure_storage`` and ``reserve`` first), then ``set_length``."""
        if self.k_store is None or not 0 <= pos <= pos + len(seg) <= self.capacity:
            raise ValueError(
                f"write_at({pos}) of {len(seg)} tokens needs storage for them (capacity {self.capacity})"
            )
        self._write(pos, seg)

    def _write(self, pos: int, seg: KVSegment) -> None:
        assert self.k_store is not None and self.v_store is not None
        for block in seg.blocks:
            n = len(block)
            keys, values = self.k_store[:, 0, :, pos : pos + n], self.v_store[:, 0, :, pos : pos + n]
            if block.stored and not seg.codec.identity:
                seg.codec.decode_into(keys, block.keys)  # one op per block for all layers
                seg.codec.decode_into(values, block.values)
            else:
                keys.copy_(block.keys)
                values.copy_(block.values)
            pos += n

    def _ensure_storage_for(self, seg: KVSegment) -> None:
        block = seg.blocks[0]
        k_dim, v_dim = block.keys.shape[3], block.values.shape[3]
        if block.stored:
            k_dim, v_dim = seg.codec.raw_dim(k_dim), seg.codec.raw_dim(v_dim)
        # [layers, heads, n, dim] -> storage is [layers, 1, heads, capacity, dim]
        self.ensure_storage(block.keys.shape[1], k_dim, seg.codec.compute_dtype, block.keys.device, v_dim)

    def segment(self, start: int, end: int, pool: KVBlockPool | None = None) -> KVSegment:
        """A view of tokens [start, end) for all layers (the cache copies what it keeps, into ``pool``'s
        slots when given)."""
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"segment [{start}, {end}) outside the buffer's {self.length} tokens")
        assert self.k_store is not None and self.v_store is not None
        keys, values = self.k_store[:, 0, :, start:end], self.v_store[:, 0, :, start:end]
        return KVSegment(keys, values, pool, self.codec)

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
