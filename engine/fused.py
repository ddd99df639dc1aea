"""FusedLlamaRunner: a gpt-fast style forward for Llama-family models, with batched decode.

Same interface as :class:`engine.runner.ModelRunner`, built from the HF model's own weights:
  * q/k/v and gate/up projections fused into one matmul each (3 fewer weight reads per layer),
  * K/V written straight into the request's KVBuffer (no Cache object, no per-step concatenation),
  * grouped-query attention without repeating K/V (SDPA ``enable_gqa``),
  * ``decode_batch``: the projections and MLP of every running request run as one matmul (decode is
    memory-bound: B tokens cost about as much as one), attention per request over its own KV,
  * ``weights="int8"``: every Linear and the lm_head as per-channel int8 (engine.quant), whose
    integer matmul is exact, so a row's result depends on that row alone at any row count;
    the lm_head's best candidates are rescored with the float weights.
Supported: llama / mistral (no sliding window) / qwen2 style layers (RMSNorm, RoPE via the model's own
rotary module, SiLU-gated MLP, optional q/k/v and o_proj biases). Anything else uses the generic
ModelRunner. Prefill runs engine.prefill_shapes' shapes (float matmuls and attention as calibrated row
tiles, engine.row_tiles), so reusing cached KV is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

import torch
import torch.nn.functional as F

from engine.chunks.reuse import rotation_blocker
from engine.config import WeightsFormat
from engine.kv.codec import KVCodec
from engine.kv.state import KVBuffer
from engine.prefill_shapes import QUERY_ROWS, aligned_keys, attention_menu, key_block_spans, prefill_mask
from engine.quant.linear import Int8Weight, int8_linear, rescore_top
from engine.quant.model import int8_model
from engine.row_tiles import BASE_MENU, TILE, TileMenu, linear_menu, round_up, tiled_linear
from engine.runner import prefix_reuse_blocker
from engine.runners import RunnerCapabilities

SUPPORTED_TYPES = frozenset({"llama", "mistral", "qwen2"})
WEIGHTS_FORMATS: tuple[str, ...] = get_args(WeightsFormat)
Weight = torch.Tensor | Int8Weight  # a Linear weight [out, in]: float, or packed int8
# one attention call of a prefill: first query row, real rows, tile rows, keys read, mask [tile, keys]
_AttentionCall = tuple[int, int, int, int, torch.Tensor]


def fused_unsupported_reason(model: Any) -> str | None:
    """Why the fused runner cannot run this model (None: it can)."""
    config = model.config
    if config.model_type not in SUPPORTED_TYPES:
        return f"model_type {config.model_type!r} not in {sorted(SUPPORTED_TYPES)}"
    blocker = prefix_reuse_blocker(config)
    if blocker:
        return blocker  # e.g. sliding windows: only transformers' own masks get those right
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(model, "lm_head"):
        return "unexpected module layout"
    attn = layers[0].self_attn
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return "q/k norms"
    if any(not hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "unexpected attention projections"
    return None


def _fused_parameter(modules: list[Any], name: str) -> torch.Tensor:
    """Concatenate ``module.<name>`` along rows and point each module at its slice of the result.

    Made once per model: later runners over the same model find the fused tensor and reuse it.
    """
    marker = f"_prefixrag_fused_{name}"
    params = [getattr(mod, name) for mod in modules]
    fused = getattr(modules[0], marker, None)
    if fused is not None and _points_into(params, fused):
        return fused
    with torch.no_grad():
        fused = torch.cat([p.data for p in params]).contiguous()
    offset = 0
    for p in params:
        p.data = fused[offset : offset + p.shape[0]]  # a view: the model keeps working, memory is shared
        offset += p.shape[0]
    setattr(modules[0], marker, fused)
    return fused


def _points_into(params: list[torch.Tensor], fused: torch.Tensor) -> bool:
    offset = 0
    for p in params:
        if p.data.data_ptr() != fused[offset].data_ptr() or p.dtype != fused.dtype:
            return False
        offset += p.shape[0]
    return offset == fused.shape[0]


@dataclass
class _Layer:
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    wqkv: Weight  # [(H + 2 KVH) D, hidden]
    bqkv: torch.Tensor | None
    wo: Weight  # [hidden, H D]
    bo: torch.Tensor | None
    wgu: Weight  # [2 I, hidden]
    wdown: Weight  # [hidden, I]


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
        self.scale = float(getattr(inner.layers[0].self_attn, "scaling", self.head_dim**-0.5))
        self.lm_head: Weight
        # int8: the float lm_head and final norm that rescore int8's best candidates exactly
        self.exact_head: tuple[torch.Tensor, torch.Tensor] | None = None
        if weights == "int8":
            self.exact_head = (self.final_norm, model.lm_head.weight)
            self.layers, self.final_norm, self.lm_head = self._int8(model, tokenizer)
        else:
            self.layers = [self._fuse(layer) for layer in inner.layers]
            self.lm_head = model.lm_head.weight
        # float matmuls of TILE rows or more run as calibrated tiles (a prefill always has that many);
        # decode runs its B rows as they are (a GEMV is much faster), unless batch_invariant
        self.menus: dict[tuple[int, int], TileMenu] = {}
        for w in (self.layers[0].wqkv, self.layers[0].wo, self.layers[0].wgu, self.layers[0].wdown):
            if isinstance(w, torch.Tensor):
                self.menus[(w.shape[0], w.shape[1])] = linear_menu(w.shape[1], w.shape[0], w.dtype)
        self.attention_tiles = attention_menu(
            self._attend, self.heads, self.kv_heads, self.head_dim, self.dtype, self.scale
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

    @staticmethod
    def _fuse(layer: Any) -> _Layer:
        """Fused weights for one layer, made once per model: afterwards the model's own q/k/v and
        gate/up weights are views into the fused tensors, so no weight is held twice."""
        a, m = layer.self_attn, layer.mlp
        wqkv = _fused_parameter([a.q_proj, a.k_proj, a.v_proj], "weight")
        bias = _fused_parameter([a.q_proj, a.k_proj, a.v_proj], "bias") if a.q_proj.bias is not None else None
        return _Layer(
            in_norm=layer.input_layernorm.weight,
            post_norm=layer.post_attention_layernorm.weight,
            wqkv=wqkv,
            bqkv=bias,
            wo=a.o_proj.weight,
            bo=a.o_proj.bias,
            wgu=_fused_parameter([m.gate_proj, m.up_proj], "weight"),
            wdown=m.down_proj.weight,
        )

    def _int8(self, model: Any, tokenizer: Any) -> tuple[list[_Layer], torch.Tensor, Int8Weight]:
        """Layers, final norm and lm_head over the model's int8 copy (engine.quant_model), whose norm
        weights carry its smoothing; the model itself is only read."""
        int8 = int8_model(model, tokenizer)
        layers = []
        for layer, q in zip(model.model.layers, int8.layers):
            a = layer.self_attn
            bias = None
            if a.q_proj.bias is not None:
                bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach()
            norms = {"in_norm": q.in_norm.to(self.dtype), "post_norm": q.post_norm.to(self.dtype)}
            bo = None if a.o_proj.bias is None else a.o_proj.bias.detach()
            layers.append(_Layer(**norms, wqkv=q.qkv, bqkv=bias, wo=q.o, bo=bo, wgu=q.gate_up, wdown=q.down))
        return layers, int8.final_norm.to(self.dtype), int8.lm_head

    def new_buffer(self, capacity: int) -> KVBuffer:
        # room for a prefill's key padding
        return KVBuffer(self.num_layers, aligned_keys(capacity), self.kv_codec)

    def weight_bytes(self) -> int:
        """Bytes of the weights this runner computes with (embedding, norms, Linears, lm_head)."""
        tensors: dict[int, int] = {}
        held = [self.embed, self.final_norm, self.lm_head, *(self.exact_head or ())]
        for layer in self.layers:
            held += [
                layer.in_norm,
                layer.post_norm,
                layer.wqkv,
                layer.bqkv,
                layer.wo,
                layer.bo,
                layer.wgu,
                layer.wdown,
            ]
        int8 = 0
        for w in held:
            if isinstance(w, Int8Weight):
                int8 += w.nbytes
            elif w is not None:  # shared storage (a tied lm_head) counts once
                tensors[w.untyped_storage().data_ptr()] = w.untyped_storage().nbytes()
        return int8 + sum(tensors.values())

    # ---- building blocks --------------------------------------------------------------------
    def _linear(self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        # every projection and the lm_head go through here: x [T, in] -> [T, out]
        if isinstance(weight, Int8Weight):
            return int8_linear(x, weight, bias)
        if x.shape[0] < TILE or not self.exact_shapes:  # decode's few rows: no row-exactness promised
            return F.linear(x, weight, bias)
        # the lm_head has no menu: it only ever runs one tile of rows (or decode's few)
        return tiled_linear(x, weight, self.menus.get((weight.shape[0], weight.shape[1]), BASE_MENU), bias)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _qkv(
        self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        # x: [T, hidden] -> q [T, H, D], k/v [T, KVH, D] (rope applied to q and k)
        qkv = self._linear(self._norm(x, layer.in_norm), layer.wqkv, layer.bqkv)
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        q, k, v = qkv.split((h * d, kvh * d, kvh * d), dim=-1)
        q = self._rope(q.view(-1, h, d), cos, sin)
        k = self._rope(k.view(-1, kvh, d), cos, sin)
        return q, k, v.view(-1, kvh, d)

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = self._linear(self._norm(x, layer.post_norm), layer.wgu).chunk(2, dim=-1)
        return self._linear(F.silu(gate) * up, layer.wdown)

    def _attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        past: int,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # q: [R, H, D], row i at position past + i; keys/values: [1, KVH, K, D] -> [R, H*D].
        # Keys past the last query's position must be finite: the causal mask hides them.
        r = q.shape[0]
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, R, D]
        if r == 1 and mask is None and keys.shape[2] == past + 1:  # one query over exactly its keys
            out = F.scaled_dot_product_attention(qh, keys, values, scale=self.scale, enable_gqa=True)
        else:  # causal with an offset: query i sees keys 0..past + i
            if mask is None:
                mask = prefill_mask(r, past, keys.shape[2], q.device)
            out = F.scaled_dot_product_attention(
                qh, keys, values, attn_mask=mask, scale=self.scale, enable_gqa=True
            )
        return out[0].transpose(0, 1).reshape(r, -1)

    def _attention_calls(self, past: int, s: int) -> list[_AttentionCall]:
        """How a prefill call's ``s`` queries attend: per key block their positions fall in, query
        tiles from the attention menu, each under an explicit mask (see engine.prefill_shapes)."""
        calls = []
        for a, b, keys in key_block_spans(past, s):
            start = a
            plan = self.attention_tiles.plan(b - a) if self.exact_shapes else (round_up(b - a, TILE),)
            for size in plan:
                real = min(size, b - start)
                calls.append((start, real, size, keys, prefill_mask(size, past + start, keys, self.device)))
                start += real
        return calls

    def _attend_tiles(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        past: int,
        calls: list[_AttentionCall],
    ) -> torch.Tensor:
        # q: [R, H, D] -> [R, H*D]: each tile's real rows, padded; rows past the calls (matmul
        # padding) attend to nothing
        out = q.new_zeros(q.shape[0], self.heads * self.head_dim)
        for start, real, size, n, mask in calls:
            rows = self._pad_rows(q[start : start + real], size)
            attn = self._attend(rows, keys[:, :, :n], values[:, :, :n], past + start, mask)
            out[start : start + real] = attn[:real]
        return out

    def _attn_out(self, layer: _Layer, attn: torch.Tensor) -> torch.Tensor:
        # attn: [T, H*D] -> [T, hidden] (o_proj)
        return self._linear(attn, layer.wo, layer.bo)

    def round_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V as the cache stores them (rounded through the KV format; unchanged for float32)."""
        return self.kv_format(k), self.kv_format(v)

    def kv_format(self, x: torch.Tensor) -> torch.Tensor:
        """Keys or values rounded through the cache's KV format (unchanged for float32)."""
        return x if self._kv_round is None else self._kv_round(x)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] -> cos/sin [T, 1, D] broadcasting over heads
        cos, sin = self.rotary(self.embed[:1], positions.unsqueeze(0))
        return cos[0].unsqueeze(1), sin[0].unsqueeze(1)

    def _decode_rows(self, batch: int) -> int:
        """Matmul rows a decode step of ``batch`` tokens runs (whole tiles when batch_invariant)."""
        return round_up(batch, TILE) if self.batch_invariant else batch

    def _padded_ids(self, token_ids: Sequence[int], rows: int) -> torch.Tensor:
        ids = list(token_ids)
        ids += [0] * (rows - len(ids))
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    @staticmethod
    def _clear_key_padding(buffer: KVBuffer, start: int, end: int) -> None:
        """Zero every layer's keys/values [start, end): attention reads them under the mask, so they
        must be finite, and recycled storage may hold anything."""
        k_store, v_store = buffer.stores()
        k_store[:, :, :, start:end] = 0
        v_store[:, :, :, start:end] = 0

    @staticmethod
    def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
        if x.shape[0] >= rows:
            return x
        return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self._linear(self._norm(x, self.final_norm), self.lm_head).float()
        if self.exact_head is not None:
            norm, head = self.exact_head
            logits = rescore_top(logits, self._norm(x, norm), head)
        return logits

    def last_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[vocab]`` of the last row of ``x``, computed as one tile."""
        return self._logits(self._pad_rows(x[-1:], TILE))[0]

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
        if past + s > self.max_context:
            raise ValueError(f"sequence of {past + s} tokens exceeds the model's {self.max_context}")
        buffer.ensure_storage(self.kv_heads, self.head_dim, self.dtype, self.device)
        keys_end = aligned_keys(past + s)
        buffer.reserve(keys_end)
        self._clear_key_padding(buffer, past + s, keys_end)
        ids = self._padded_ids(token_ids, round_up(s, TILE))  # [R] rows, the real ones first
        x = F.embedding(ids, self.embed)  # [R, hidden]
        positions = torch.arange(past, past + len(ids), device=self.device)
        cos, sin = self._rotary(positions)
        calls = self._attention_calls(past, s)
        k_store, v_store = buffer.stores()
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            k, v = self.round_kv(k[:s], v[:s])
            k_store[i, 0, :, past : past + s] = k[:s].transpose(0, 1)
            v_store[i, 0, :, past : past + s] = v[:s].transpose(0, 1)
            attn = self._attend_tiles(
                q, k_store[i, :, :, :keys_end], v_store[i, :, :, :keys_end], past, calls
            )
            x = x + self._attn_out(layer, attn)
            x = x + self._mlp(layer, x)
        buffer.set_length(past + s)
        return self.last_logits(x[:s])

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
        exact = self.batch_invariant
        ends = [aligned_keys(p + 1) if exact else p + 1 for p in pasts]  # keys each attention reads
        for b, p, end in zip(buffers, pasts, ends):
            if p + 1 > self.max_context:
                raise ValueError(f"sequence of {p + 1} tokens exceeds the model's {self.max_context}")
            b.ensure_storage(self.kv_heads, self.head_dim, self.dtype, self.device)
            b.reserve(end)
            if exact:
                self._clear_key_padding(b, p + 1, end)
        batch = len(token_ids)
        ids = self._padded_ids(token_ids, self._decode_rows(batch))  # [B'] >= B rows
        x = F.embedding(ids, self.embed)  # [B', hidden]
        positions = torch.tensor(pasts + [0] * (len(ids) - batch), device=self.device)
        cos, sin = self._rotary(positions)
        rows = QUERY_ROWS if exact else 1
        masks = [prefill_mask(rows, p, end, self.device) if exact else None for p, end in zip(pasts, ends)]
        stores = [b.stores() for b in buffers]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)  # [B', H, D], [B', KVH, D]
            k, v = self.round_kv(k, v)
            outs = []
            for j, (k_store, v_store) in enumerate(stores):
                p, end = pasts[j], ends[j]
                k_store[i, 0, :, p] = k[j]
                v_store[i, 0, :, p] = v[j]
                qj = self._pad_rows(q[j : j + 1], rows)  # [rows, H, D]
                attn = self._attend(qj, k_store[i, :, :, :end], v_store[i, :, :, :end], p, masks[j])
                outs.append(attn[:1])
            x = x + self._attn_out(layer, self._pad_rows(torch.cat(outs), len(ids)))
            x = x + self._mlp(layer, x)
        for b, p in zip(buffers, pasts):
            b.set_length(p + 1)
        return list(self._logits(x)[:batch])


def drop_float_linears(model: Any) -> None:
    """Free the float weights of every projection once an int8 runner holds copies: the model can no
    longer run its own forward. The embedding, the norms and the lm_head (read to rescore) stay."""
    modules = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        modules += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    for module in modules:
        module.weight = torch.nn.Parameter(module.weight.new_empty(0), requires_grad=False)
