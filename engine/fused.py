"""FusedLlamaRunner: a gpt-fast style forward for Llama-family models, with batched decode.

Same interface as :class:`engine.runner.ModelRunner`, built from the HF model's own weights
(engine.llama_weights):
  * q/k/v and gate/up projections fused into one matmul each (3 fewer weight reads per layer),
  * K/V written straight into the request's KVBuffer (no Cache object, no per-step concatenation),
  * grouped-query attention without repeating K/V (SDPA ``enable_gqa``),
  * one layer loop, :meth:`run_layers`, over explicit positions (gpt-fast's ``forward(idx,
    input_pos)``): a prefill, a batched decode step and a stitched prefill differ only in where
    their tokens' K/V go and how their queries attend (engine.fused_attention),
  * ``decode_batch``: the projections and MLP of every running request run as one matmul over
    weights prepacked for few rows (engine.packed_linear; decode is memory-bound: B tokens cost
    about as much as one), attention per request over its own KV,
  * ``weights="int8"``: every Linear and the lm_head as per-channel int8 (engine.quant), whose
    integer matmul is exact, so a row's result depends on that row alone at any row count;
    the lm_head's best candidates are rescored with the float weights.
Supported: llama / mistral (no sliding window) / qwen2 style layers (RMSNorm, RoPE via the model's own
rotary module, SiLU-gated MLP, optional q/k/v and o_proj biases). Anything else uses the generic
ModelRunner. Prefill runs engine.prefill_shapes' shapes (float matmuls and attention as calibrated row
tiles, engine.row_tiles), or the native kernels whose rows are exact at any count (engine.native:
float32 on CPUs with AVX2 and FMA, bfloat16 on AVX512-BF16 without AMX), so reusing cached KV is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, get_args

import torch
import torch.nn.functional as F

from engine.chunks.reuse import rotation_blocker
from engine.config import WeightsFormat
from engine.fused_attention import (
    Attention,
    DecodeAttention,
    PositionsAttention,
    PrefillAttention,
    attend,
    pad_rows,
)
from engine.kv.codec import KVCodec
from engine.kv.state import KVBuffer
from engine.llama_weights import (
    LlamaLayer,
    Weight,
    drop_float_linears,
    fuse_layer,
    fused_unsupported_reason,
    int8_layers,
    weight_bytes,
)
from engine.native.attention import NativeAttention
from engine.native.build import NativeBuildError, build_key
from engine.native.decode import NativeDecode, unavailable_reason
from engine.native.int8 import Int8Tiled, int8_reason
from engine.native.linear import TiledLinear
from engine.native.linear import available as linear_available
from engine.native.linear import preferred as linear_preferred
from engine.native.rows import NativeRows
from engine.packed_linear import PackedLinear, packed_menu
from engine.prefill_shapes import aligned_keys, attention_menu
from engine.quant.linear import Int8Weight, int8_linear, rescore_top
from engine.rope_table import RopeTable
from engine.row_tiles import BASE_MENU, TILE, TileMenu, linear_menu, round_up, tiled_linear
from engine.runners import RunnerCapabilities

WEIGHTS_FORMATS: tuple[str, ...] = get_args(WeightsFormat)
log = logging.getLogger(__name__)

__all__ = ["FusedLlamaRunner", "drop_float_linears", "fused_unsupported_reason"]


class FusedLlamaRunner:
    """Fast forward for Llama-family models over per-request KVBuffers.

    Example:
        >>> runner = FusedLlamaRunner(loaded.model)        # doctest: +SKIP
        >>> buf = runner.new_buffer(2048)
        >>> logits = runner.prefill(prompt_ids, buf)      # [vocab] float32, last position
        >>> rows = runner.decode_batch([t1, t2], [buf1, buf2])
    """

    def __init__(
        self,
        model: Any,
        *,
        batch_invariant: bool = False,
        weights: WeightsFormat = "float32",
        tokenizer: Any = None,
        kv_codec: KVCodec | None = None,
        exact_shapes: bool = True,
        native_decode: bool = True,
        native_rows: bool = True,
        native_attention: bool = True,
        native_linear: bool | None = None,
    ) -> None:
        reason = fused_unsupported_reason(model)
        if reason:
            raise ValueError(f"FusedLlamaRunner cannot run this model: {reason}")
        if weights not in WEIGHTS_FORMATS:
            raise ValueError(f"weights must be one of {list(WEIGHTS_FORMATS)}, got {weights!r}")
        if weights == "int8" and tokenizer is None:
            raise ValueError("weights='int8' needs the model's tokenizer (its calibration reads text)")
        self.weights = weights
        cfg = model.config
        self.model = model
        self.config = cfg
        self.num_layers = int(cfg.num_hidden_layers)
        self.vocab_size = int(cfg.vocab_size)
        self.max_context = int(cfg.max_position_embeddings)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.eps = float(cfg.rms_norm_eps)
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        self.rotary = inner.rotary_emb
        self.rope = RopeTable(self.rotary, self.embed)
        self.scale = float(getattr(inner.layers[0].self_attn, "scaling", self.head_dim**-0.5))
        self.lm_head: Weight
        # int8: the float lm_head and final norm that rescore int8's best candidates exactly
        self.exact_head: tuple[torch.Tensor, torch.Tensor] | None = None
        self.packed = False  # the runner holds its own packed Linears (the model's own copies unused)
        self.tiled = False  # they are TiledLinears (engine.native.linear): row-exact at any row count
        self.tiled_int8 = False  # int8 matrices as Int8Tiled (engine.native.int8)
        # decode in one native call (engine.native.decode); None: the layer loop, for native_reason
        self.native: NativeDecode | None = None
        self.native_reason: str | None = None
        # a prefill's norms, RoPE and SiLU * value in one native pass each (engine.native.rows)
        widths = (int(cfg.hidden_size), self.head_dim, int(cfg.intermediate_size))
        self.rows = NativeRows.of(self.dtype, self.eps, widths) if native_rows else None
        # a prefill's attention, each row over its own keys (engine.native.attention) wherever it can
        # run, unless native_attention=False; None: SDPA in tiles
        self.attention = NativeAttention.of(self.dtype, self.head_dim) if native_attention else None
        if weights == "int8":
            self.exact_head = (self.final_norm, model.lm_head.weight)
            self.layers, self.final_norm, self.lm_head = int8_layers(model, tokenizer, self.dtype)
            # int8 matrices in the native kernels' tiles (engine.native.int8), the same bits as
            # engine.quant's: wherever they run, unless native_linear=False
            if native_linear is not False and int8_reason() is None:
                self._tile_int8()
            self.native = self._native(native_decode, kv_codec)
        else:
            self.layers = [fuse_layer(layer) for layer in inner.layers]
            self.lm_head = model.lm_head.weight
            # every float matmul in the native kernels' column tiles (engine.native.linear)
            # where preferred (None), wherever they can run with True, never with False
            wanted = {None: linear_preferred, True: linear_available}.get(native_linear)
            if wanted is not None and wanted(self.dtype):
                for layer in self.layers:
                    layer.tile()
                self.lm_head = TiledLinear.of(model.lm_head.weight)
            self.native = self._native(native_decode, kv_codec)  # reads the tiles, or plain tensors
            # else bfloat16 matmuls on weights packed once for oneDNN (engine.packed_linear)
            self.tiled = isinstance(self.lm_head, TiledLinear)
            self.packed = self.tiled or all([layer.pack() for layer in self.layers])
            if self.packed and not self.tiled:
                self.lm_head = PackedLinear.of(model.lm_head.weight)
        # float matmuls of TILE rows or more run as calibrated tiles (a prefill always has that many);
        # decode runs its B rows as they are (a GEMV is much faster), unless batch_invariant
        self.menus: dict[tuple[int, ...], TileMenu] = {}
        first = self.layers[0]
        menu = packed_menu if self.packed else linear_menu  # calibrated on the kernel that runs
        for w in (first.wqkv, first.wo, first.wgu, first.wdown):
            if isinstance(w, (torch.Tensor, PackedLinear)):
                self.menus[tuple(w.shape)] = menu(w.shape[1], w.shape[0], w.dtype)
        # SDPA's query tiles, calibrated only where SDPA runs: no native kernel, or a KV format that
        # stores another dtype than the kernel reads (PrefillAttention then falls back to them)
        identity = kv_codec is None or kv_codec.identity
        self.attention_tiles = (
            attention_menu(self._attend, self.heads, self.kv_heads, self.head_dim, self.dtype, self.scale)
            if self.attention is None or not identity
            else None
        )
        # batch_invariant decode runs a prefill's shapes (TILE matmul rows, one query tile over full
        # key blocks): a token never depends on its batch mates, and its KV equals a prefill's
        self.batch_invariant = batch_invariant
        # False: each prefill matmul and key-block span in one call of whatever size (reuse then rounds
        # as the kernels choose; kept to measure what the exact shapes cost)
        self.exact_shapes = exact_shapes
        # K/V are rounded through the cache's storage format before attention, on every path
        self.kv_codec = kv_codec
        self._kv_round = kv_codec.round if kv_codec is not None and not kv_codec.identity else None
        self.capabilities = RunnerCapabilities(
            batched_decode=True, int8_weights=weights == "int8", stitch_blocker=rotation_blocker(self.rotary)
        )

    def _tile_int8(self) -> None:
        for layer in self.layers:
            for name in ("wqkv", "wo", "wgu", "wdown"):
                weight = getattr(layer, name)
                assert isinstance(weight, Int8Weight)
                setattr(layer, name, Int8Tiled.of(weight))
        assert isinstance(self.lm_head, Int8Weight)
        self.lm_head = Int8Tiled.of(self.lm_head)
        self.tiled_int8 = True

    def _native(self, wanted: bool, kv_codec: KVCodec | None) -> NativeDecode | None:
        identity = kv_codec is None or kv_codec.identity
        self.native_reason = (
            unavailable_reason(self.dtype, self.weights != "int8", identity)
            if wanted
            else "native_decode=False"
        )
        if self.native_reason is not None:
            return None
        geometry = (self.heads, self.kv_heads, self.head_dim)
        head = self._rescored if self.weights == "int8" else None
        try:
            return NativeDecode.of(
                self.layers, self.final_norm, self.lm_head, geometry, self.eps, self.scale, head
            )
        except NativeBuildError as exc:
            self.native_reason = str(exc)
            log.warning("decode runs the Python layer loop: %s", exc)
            return None

    @property
    def row_kernels(self) -> str:
        """What computes a prefill's norms, RoPE and SiLU: ``native <build key>`` or ``torch``."""
        return f"native {build_key()}" if self.rows is not None else "torch"

    @property
    def rows_exact(self) -> bool:
        """Whether a prefill's every kernel computes a row alone at any row count (the native Linears,
        float or int8, and attention over a KV store in the compute dtype): then no row is padded to a
        tile."""
        identity = self.kv_codec is None or self.kv_codec.identity
        return (self.tiled or self.tiled_int8) and self.attention is not None and identity

    @property
    def linear_kernel(self) -> str:
        """What computes a prefill's Linears: ``native <build key>``, or ``onednn``, ``torch`` or ``int8``
        in row tiles."""
        if self.tiled:
            return f"native {build_key()}"
        if self.tiled_int8:
            return f"native int8 {build_key()}"
        return "int8" if self.weights == "int8" else "onednn" if self.packed else "torch"

    @property
    def attention_kernel(self) -> str:
        """What computes a prefill's attention: ``native <kernel> <build key>`` or ``torch`` (SDPA in
        tiles)."""
        return f"native {self.attention.name} {build_key()}" if self.attention is not None else "torch"

    @property
    def decode_kernel(self) -> dict[str, str | None]:
        """Which decode step runs (``native`` or ``layers``) and, for the layer loop, why."""
        if self.native is not None and not self.batch_invariant:
            return {"kernel": "native", "reason": None}
        reason = "batch_invariant decode runs a prefill's shapes" if self.native else self.native_reason
        return {"kernel": "layers", "reason": reason}

    def new_buffer(self, capacity: int) -> KVBuffer:
        # room for a prefill's key padding
        return KVBuffer(self.num_layers, aligned_keys(capacity), self.kv_codec)

    def weight_bytes(self) -> int:
        """Bytes of the weights this runner computes with (embedding, norms, Linears, lm_head)."""
        held: list[Any] = [self.embed, self.final_norm, self.lm_head, *(self.exact_head or ())]
        held += self.native.held if self.native is not None else []
        for layer in self.layers:
            held += layer.tensors()
        return weight_bytes(held)

    # ---- building blocks --------------------------------------------------------------------
    def _linear(
        self,
        x: torch.Tensor,
        weight: Weight,
        bias: torch.Tensor | None = None,
        exact: bool = True,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # every projection and the lm_head go through here: x [T, in] -> [T, out], then residual + that
        # (in the kernel's epilogue where it has one: the same bits as torch's add)
        if isinstance(weight, TiledLinear):  # each row alone: no tiles needed
            return weight(x, bias, residual)
        if isinstance(weight, PackedLinear):
            if self._one_call(x, exact):
                return weight(x, bias, residual)
            return weight.tiled(x, self._menu(weight), bias, residual)
        if isinstance(weight, Int8Weight):
            out = int8_linear(x, weight, bias)
        elif isinstance(weight, Int8Tiled):  # int8_linear's bits
            out = weight(x, bias)
        elif self._one_call(x, exact):
            out = F.linear(x, weight, bias)
        else:
            out = tiled_linear(x, weight, self._menu(weight), bias)
        return out if residual is None else residual + out

    def _one_call(self, x: torch.Tensor, exact: bool) -> bool:
        # decode's few rows, or rows whose KV no cache holds: no row-exactness promised, one call
        return x.shape[0] < TILE or not (exact and self.exact_shapes)

    def _menu(self, weight: torch.Tensor | PackedLinear) -> TileMenu:
        # the lm_head has no menu: it only ever runs one tile of rows (or decode's few)
        return self.menus.get(tuple(weight.shape), BASE_MENU)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.rows is not None and x.dim() == 2:
            return self.rows.norm(x, weight)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _qkv(
        self, layer: LlamaLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, exact: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [T, hidden] -> q [T, H, D], k/v [T, KVH, D] (rope applied to q and k)
        qkv = self._linear(self._norm(x, layer.in_norm), layer.wqkv, layer.bqkv, exact)
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        if self.rows is not None and cos.dtype == qkv.dtype:
            q, k = self.rows.rope(qkv, cos, sin, h, kvh)
            return q, k, qkv[:, (h + kvh) * d :].view(-1, kvh, d)
        # q and k rotate in one elementwise pass: the same bits as one at a time
        qk = self._rope(qkv[:, : (h + kvh) * d].view(-1, h + kvh, d), cos, sin)
        return qk[:, :h].contiguous(), qk[:, h:], qkv[:, (h + kvh) * d :].view(-1, kvh, d)

    def _gated(self, layer: LlamaLayer, x: torch.Tensor, exact: bool = True) -> torch.Tensor:
        # x: [T, hidden] -> silu(gate) * up [T, intermediate] of its post-attention norm
        normed = self._norm(x, layer.post_norm)
        if self.rows is not None and isinstance(layer.wgu, TiledLinear):  # one native pass where it runs
            return layer.wgu.glu(normed, self.rows.silu_mul)
        gate_up = self._linear(normed, layer.wgu, exact=exact)
        if self.rows is not None:
            return self.rows.silu_mul(gate_up)
        gate, value = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * value

    def _added(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        weight: Weight,
        bias: torch.Tensor | None = None,
        exact: bool = True,
    ) -> torch.Tensor:
        # the residual stream x [T, hidden] plus the projection of h (o_proj, down_proj)
        return self._linear(h, weight, bias, exact, residual=x)

    def _attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        past: int,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return attend(q, keys, values, past, self.scale, mask)

    def round_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V as the cache stores them (rounded through the KV format; unchanged for float32)."""
        return self.kv_format(k), self.kv_format(v)

    @property
    def kv_format_identity(self) -> bool:
        """Whether the KV format stores keys and values as computed (``kv_format`` changes nothing)."""
        return self._kv_round is None

    def kv_format(self, x: torch.Tensor) -> torch.Tensor:
        """Keys or values rounded through the cache's KV format (unchanged for float32)."""
        return x if self._kv_round is None else self._kv_round(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        normed = self._norm(x, self.final_norm)
        if isinstance(self.lm_head, TiledLinear):  # float32 sums, as the native decode step's
            return self.lm_head.sums(normed)
        logits = self._linear(normed, self.lm_head).float()
        return logits if self.exact_head is None else self._rescored(logits, x)

    def _rescored(self, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # int8 logits [B, vocab] of hidden states x: their best candidates recomputed in float
        assert self.exact_head is not None
        norm, head = self.exact_head
        return rescore_top(logits, self._norm(x, norm), head)

    def last_logits(self, x: torch.Tensor, exact: bool = True) -> torch.Tensor:
        """Float32 logits ``[vocab]`` of the last row of ``x``, computed as one tile (alone where the
        lm_head is row-exact, or where ``exact`` is False: the row of a stitched prefill)."""
        alone = self.tiled or self.tiled_int8 or not exact
        return self._logits(x[-1:] if alone else pad_rows(x[-1:], TILE))[0]

    def embed_ids(self, token_ids: Sequence[int], rows: int = 0) -> torch.Tensor:
        """Hidden states ``[max(len, rows), hidden]`` of ``token_ids``, padded with token 0."""
        ids = list(token_ids) + [0] * max(0, rows - len(token_ids))
        return F.embedding(torch.tensor(ids, dtype=torch.long, device=self.device), self.embed)

    # ---- the layer loop ---------------------------------------------------------------------
    def run_layers(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        attention: Attention,
        layers: Iterable[int] | None = None,
        exact: bool = True,
    ) -> torch.Tensor:
        """Run hidden states ``x [T, hidden]`` (row i at ``positions[i]``) through ``layers`` (default
        all): each writes the rows' K/V and attends as ``attention`` says. Returns the new ``x``.
        ``exact=False``: each matmul in one call, its rows' results then depend on the row count (for
        rows whose KV no cache holds, such as a stitched prefill's)."""
        cos, sin = self.rope(positions)
        for i in range(self.num_layers) if layers is None else layers:
            layer = self.layers[i]
            q, k, v = self._qkv(layer, x, cos, sin, exact)
            attention.write(i, *self.round_kv(k, v))
            x = self._added(x, attention.attend(i, q), layer.wo, layer.bo, exact)
            x = self._added(x, self._gated(layer, x, exact), layer.wdown, exact=exact)
        return x

    def layer_kv(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The K/V ``[T, KVH, D]`` (in the cache's format) that ``layer`` computes for hidden states
        ``x`` at ``positions``, written nowhere (for a stitched prefill: each matmul in one call)."""
        cos, sin = self.rope(positions)
        _, k, v = self._qkv(self.layers[layer], x, cos, sin, exact=False)
        return self.round_kv(k, v)

    def run_at(
        self, buffer: KVBuffer, x: torch.Tensor, positions: torch.Tensor, layers: Iterable[int] | None = None
    ) -> torch.Tensor:
        """``x`` at explicit ascending ``positions`` of ``buffer`` (a stitched prefill, whose KV no cache
        holds: each matmul in one call): every layer writes their K/V there, then attends causally over
        what the buffer holds up to each position."""
        attention = PositionsAttention(buffer, positions, self.scale, self.attention)
        return self.run_layers(x, positions, attention, layers, exact=False)

    # ---- forward passes ---------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], buffer: KVBuffer) -> torch.Tensor:
        """Extend ``buffer`` with ``token_ids``; return float32 logits of the last position ``[vocab]``.

        Every call runs engine.prefill_shapes' shapes (matmul rows, query blocks, key blocks), so a
        token's KV and logits are the same bits however the prompt is split into calls.
        """
        s = len(token_ids)
        if s == 0:
            raise ValueError("forward needs at least one token")
        past = buffer.length
        self._check_context(past + s)
        buffer.ensure_storage(self.kv_heads, self.head_dim, self.dtype, self.device)
        # [R, hidden], the real rows first: padded to whole matmul tiles unless every kernel is row-exact
        x = self.embed_ids(token_ids, s if self.rows_exact else round_up(s, TILE))
        positions = torch.arange(past, past + x.shape[0], device=self.device)
        tiles = self.attention_tiles if self.exact_shapes else None
        attention = PrefillAttention(buffer, past, s, tiles, self.scale, self.attention)
        if self.rows_exact and attention.native is not None:  # no padding rows: the last is the prompt's
            x = self.run_layers(x, positions, attention, range(self.num_layers - 1))
            x = self._last_row(x, positions, attention)
        else:
            x = self.run_layers(x, positions, attention)
        buffer.set_length(past + s)
        return self.last_logits(x[:s])

    def _last_row(
        self, x: torch.Tensor, positions: torch.Tensor, attention: PrefillAttention
    ) -> torch.Tensor:
        """The last layer of a prefill whose kernels are row-exact: every row's K/V, then the output of the
        last row alone ``[1, hidden]``, the only one the logits read (the bits it gets in the whole layer)."""
        i = self.num_layers - 1
        layer = self.layers[i]
        cos, sin = self.rope(positions)
        q, k, v = self._qkv(layer, x, cos, sin)
        attention.write(i, *self.round_kv(k, v))
        x = self._added(x[-1:], attention.attend_last(i, q[-1:]), layer.wo, layer.bo)
        return self._added(x, self._gated(layer, x), layer.wdown)

    def prefill(self, token_ids: Sequence[int], buffer: KVBuffer) -> torch.Tensor:
        return self.forward(token_ids, buffer)

    def decode_step(self, token_id: int, buffer: KVBuffer) -> torch.Tensor:
        return self.decode_batch([token_id], [buffer])[0]

    @torch.inference_mode()
    def decode_batch(self, token_ids: Sequence[int], buffers: Sequence[KVBuffer]) -> list[torch.Tensor]:
        """One token for each of B sequences: shared matmuls, attention per sequence.

        With ``batch_invariant`` a token is computed in a prefill's shapes (padded matmul rows, a full
        query block over aligned keys), so its KV is the same bits a prefill would write.
        """
        pasts = [b.length for b in buffers]
        for b, p in zip(buffers, pasts):
            self._check_context(p + 1)
            b.ensure_storage(self.kv_heads, self.head_dim, self.dtype, self.device)
        batch = len(token_ids)
        if self.native is not None and not self.batch_invariant:
            cos, sin = self.rope(torch.tensor(pasts, device=self.device))
            logits = self.native(self.embed_ids(token_ids), cos[:, 0], sin[:, 0], buffers, pasts)
            for b, p in zip(buffers, pasts):
                b.set_length(p + 1)
            return list(logits)
        rows = round_up(batch, TILE) if self.batch_invariant else batch
        x = self.embed_ids(token_ids, rows)  # [B', hidden]
        positions = torch.tensor(pasts + [0] * (x.shape[0] - batch), device=self.device)
        attention = DecodeAttention(buffers, self.batch_invariant, self.scale, self.attention)
        x = self.run_layers(x, positions, attention)
        for b, p in zip(buffers, pasts):
            b.set_length(p + 1)
        return list(self._logits(x)[:batch])

    def _check_context(self, tokens: int) -> None:
        if tokens > self.max_context:
            raise ValueError(f"sequence of {tokens} tokens exceeds the model's {self.max_context}")
