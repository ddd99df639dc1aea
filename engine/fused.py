"""FusedLlamaRunner: a gpt-fast style forward for Llama-family models, with batched decode.

Same interface as :class:`engine.runner.ModelRunner`, built from the HF model's own weights:
  * q/k/v and gate/up projections fused into one matmul each (3 fewer weight reads per layer),
  * K/V written straight into the request's KVBuffer (no Cache object, no per-step concatenation),
  * grouped-query attention without repeating K/V (SDPA ``enable_gqa``),
  * ``decode_batch``: the projections and MLP of every running request run as one matmul (decode is
    memory-bound: B tokens cost about as much as one), attention per request over its own KV.
Supported: llama / mistral (no sliding window) / qwen2 style layers (RMSNorm, RoPE via the model's own
rotary module, SiLU-gated MLP, optional q/k/v bias). Anything else uses the generic ModelRunner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.kv import KVBuffer
from engine.runner import prefix_reuse_blocker

SUPPORTED_TYPES = frozenset({"llama", "mistral", "qwen2"})


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


def calibrate_row_padding(weight: torch.Tensor, limit: int = 16) -> list[int]:
    """For each row count m < limit, the smallest m' >= m whose matmul rows equal a large batch's.

    BLAS picks a different kernel for a few rows (GEMV for 1, special cases for 2-3, ...) whose rounding
    differs from the blocked GEMM. Padding every matmul's rows to an "invariant" count makes a token's
    result independent of how many other rows share the call: decode of 8 concurrent requests equals
    8 sequential decodes bit for bit, and a cached-prefix suffix prefill equals the full prefill.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, weight.shape[1], generator=gen).to(weight.dtype)
    reference = F.linear(x, weight)
    invariant = [m for m in range(1, limit) if torch.equal(F.linear(x[:m], weight), reference[:m])]
    table = []
    for m in range(limit):
        table.append(next((c for c in invariant if c >= m), limit) if m else 0)
    return table


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
    wqkv: torch.Tensor  # [(H + 2 KVH) D, hidden]
    bqkv: torch.Tensor | None
    wo: torch.Tensor  # [hidden, H D]
    wgu: torch.Tensor  # [2 I, hidden]
    wdown: torch.Tensor  # [hidden, I]


class FusedLlamaRunner:
    """Fast forward for Llama-family models over per-request KVBuffers.

    Example:
        >>> runner = FusedLlamaRunner(loaded.model)        # doctest: +SKIP
        >>> buf = runner.new_buffer(2048)
        >>> logits = runner.prefill(prompt_ids, buf)      # [vocab] float32, last position
        >>> rows = runner.decode_batch([t1, t2], [buf1, buf2])
    """

    def __init__(self, model: Any, *, batch_invariant: bool = False) -> None:
        reason = fused_unsupported_reason(model)
        if reason:
            raise ValueError(f"FusedLlamaRunner cannot run this model: {reason}")
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
        self.lm_head = model.lm_head.weight
        self.rotary = inner.rotary_emb
        self.scale = float(getattr(inner.layers[0].self_attn, "scaling", self.head_dim**-0.5))
        self.layers = [self._fuse(layer) for layer in inner.layers]
        # prefill rows are always padded, so a cached-prefix suffix prefill equals the full prefill;
        # decode rows only when batch_invariant (a 1-row GEMV is much faster than the padded GEMM)
        self.row_padding = calibrate_row_padding(self.layers[0].wqkv)
        self.decode_padding = self.row_padding if batch_invariant else []

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
            wgu=_fused_parameter([m.gate_proj, m.up_proj], "weight"),
            wdown=m.down_proj.weight,
        )

    def new_buffer(self, capacity: int) -> KVBuffer:
        return KVBuffer(self.num_layers, capacity)

    # ---- building blocks --------------------------------------------------------------------
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
        qkv = F.linear(self._norm(x, layer.in_norm), layer.wqkv, layer.bqkv)
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        q, k, v = qkv.split((h * d, kvh * d, kvh * d), dim=-1)
        q = self._rope(q.view(-1, h, d), cos, sin)
        k = self._rope(k.view(-1, kvh, d), cos, sin)
        return q, k, v.view(-1, kvh, d)

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(self._norm(x, layer.post_norm), layer.wgu).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, layer.wdown)

    def _attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        past: int,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # q: [S, H, D]; keys/values: [1, KVH, past+S, D] -> [S, H*D]; mask: [S, keys] bool (True: seen)
        s = q.shape[0]
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, S, D]
        if mask is not None:  # explicit positions (chunk stitching): the caller says who sees what
            out = F.scaled_dot_product_attention(
                qh, keys, values, attn_mask=mask, scale=self.scale, enable_gqa=True
            )
        elif s == 1:
            out = F.scaled_dot_product_attention(qh, keys, values, scale=self.scale, enable_gqa=True)
        elif past == 0:
            out = F.scaled_dot_product_attention(
                qh, keys, values, is_causal=True, scale=self.scale, enable_gqa=True
            )
        else:  # causal with an offset: query i sees keys [0, past + i]
            mask = torch.ones(s, past + s, dtype=torch.bool, device=q.device).tril(diagonal=past)
            out = F.scaled_dot_product_attention(
                qh, keys, values, attn_mask=mask, scale=self.scale, enable_gqa=True
            )
        return out[0].transpose(0, 1).reshape(s, -1)

    def _attn_out(self, layer: _Layer, attn: torch.Tensor) -> torch.Tensor:
        # attn: [T, H*D] -> [T, hidden] (o_proj)
        return F.linear(attn, layer.wo)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] -> cos/sin [T, 1, D] broadcasting over heads
        cos, sin = self.rotary(self.embed[:1], positions.unsqueeze(0))
        return cos[0].unsqueeze(1), sin[0].unsqueeze(1)

    def _rows(self, n: int, table: Sequence[int] | None = None) -> int:
        table = self.row_padding if table is None else table
        return table[n] if n < len(table) else n

    def _padded_ids(self, token_ids: Sequence[int], table: Sequence[int] | None = None) -> torch.Tensor:
        ids = list(token_ids)
        ids += [0] * (self._rows(len(ids), table) - len(ids))
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    @staticmethod
    def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
        if x.shape[0] >= rows:
            return x
        return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._norm(x, self.final_norm), self.lm_head).float()

    # ---- forward passes ---------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], buffer: KVBuffer) -> torch.Tensor:
        """Extend ``buffer`` with ``token_ids``; return float32 logits of the last position ``[vocab]``."""
        s = len(token_ids)
        if s == 0:
            raise ValueError("forward needs at least one token")
        past = buffer.length
        if past + s > self.max_context:
            raise ValueError(f"sequence of {past + s} tokens exceeds the model's {self.max_context}")
        buffer.ensure_storage(self.kv_heads, self.head_dim, self.dtype, self.device)
        buffer.reserve(past + s)
        ids = self._padded_ids(token_ids)  # [S'] >= S rows, see calibrate_row_padding
        x = F.embedding(ids, self.embed)  # [S', hidden]
        positions = torch.arange(past, past + len(ids), device=self.device)
        cos, sin = self._rotary(positions)
        k_store, v_store = buffer.stores()
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            k_store[i, 0, :, past : past + s] = k[:s].transpose(0, 1)
            v_store[i, 0, :, past : past + s] = v[:s].transpose(0, 1)
            attn = self._attend(q[:s], k_store[i, :, :, : past + s], v_store[i, :, :, : past + s], past)
            x = x + self._attn_out(layer, self._pad_rows(attn, len(ids)))
            x = x + self._mlp(layer, x)
        buffer.set_length(past + s)
        return self._logits(self._pad_rows(x[s - 1 : s], self._rows(1)))[0]

    def prefill(self, token_ids: Sequence[int], buffer: KVBuffer) -> torch.Tensor:
        return self.forward(token_ids, buffer)

    def decode_step(self, token_id: int, buffer: KVBuffer) -> torch.Tensor:
        return self.decode_batch([token_id], [buffer])[0]

    @torch.inference_mode()
    def decode_batch(self, token_ids: Sequence[int], buffers: Sequence[KVBuffer]) -> list[torch.Tensor]:
        """One token for each of B sequences: shared matmuls, attention per sequence."""
        pasts = [b.length for b in buffers]
        for b, p in zip(buffers, pasts):
            if p + 1 > self.max_context:
                raise ValueError(f"sequence of {p + 1} tokens exceeds the model's {self.max_context}")
            b.ensure_storage(self.kv_heads, self.head_dim, self.dtype, self.device)
            b.reserve(p + 1)
        batch = len(token_ids)
        ids = self._padded_ids(token_ids, self.decode_padding)  # [B'] >= B rows
        x = F.embedding(ids, self.embed)  # [B', hidden]
        positions = torch.tensor(pasts + [0] * (len(ids) - batch), device=self.device)
        cos, sin = self._rotary(positions)
        stores = [b.stores() for b in buffers]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)  # [B', H, D], [B', KVH, D]
            outs = []
            for j, (k_store, v_store) in enumerate(stores):
                p = pasts[j]
                k_store[i, 0, :, p] = k[j]
                v_store[i, 0, :, p] = v[j]
                outs.append(
                    self._attend(q[j : j + 1], k_store[i, :, :, : p + 1], v_store[i, :, :, : p + 1], p)
                )
            x = x + self._attn_out(layer, self._pad_rows(torch.cat(outs), len(ids)))
            x = x + self._mlp(layer, x)
        for b, p in zip(buffers, pasts):
            b.set_length(p + 1)
        return list(self._logits(x)[:batch])
