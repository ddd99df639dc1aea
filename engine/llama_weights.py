"""The weights the fused runner computes with, one :class:`LlamaLayer` per decoder layer.

Built from a Hugging Face Llama-family model: q/k/v and gate/up fused into one matrix each (the model's
own parameters become views into them, so nothing is held twice), or the model's int8 copy
(engine.quant); bfloat16 weights prepacked for their kernel (engine.packed_linear, or the native
kernels' column tiles: engine.native.linear).

Example:
    >>> layers = [fuse_layer(layer) for layer in model.model.layers]   # doctest: +SKIP
    >>> layers[0].wqkv.shape                                           # doctest: +SKIP
    torch.Size([960, 576])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.native.int8 import Int8Tiled
from engine.native.linear import TiledLinear
from engine.packed_linear import PackedLinear, packing_supported
from engine.quant.linear import Int8Weight
from engine.quant.model import int8_model
from engine.runner import prefix_reuse_blocker

SUPPORTED_TYPES = frozenset({"llama", "mistral", "qwen2"})
_FUSED_MARKER = "_prefixrag_fused_"  # module attribute holding the fused tensor its slices view
# a Linear weight [out, in]: float, int8, or packed for oneDNN or for the native kernels
Weight = torch.Tensor | Int8Weight | Int8Tiled | PackedLinear | TiledLinear


@dataclass
class LlamaLayer:
    """One decoder layer's weights."""

    in_norm: torch.Tensor
    post_norm: torch.Tensor
    wqkv: Weight  # [(H + 2 KVH) D, hidden]
    bqkv: torch.Tensor | None
    wo: Weight  # [hidden, H D]
    bo: torch.Tensor | None
    wgu: Weight  # [2 I, hidden]
    wdown: Weight  # [hidden, I]

    def pack(self) -> bool:
        """Hold the float Linears packed for their kernel where that pays; whether they now are."""
        weights = (self.wqkv, self.wo, self.wgu, self.wdown)
        if not all(isinstance(w, torch.Tensor) and packing_supported(w.dtype) for w in weights):
            return False
        self.wqkv, self.wo, self.wgu, self.wdown = (
            PackedLinear.of(w) for w in weights if isinstance(w, torch.Tensor)
        )
        return True

    def tile(self) -> None:
        """Hold the float Linears packed in column tiles for the native kernels (engine.native.linear)."""
        weights = (self.wqkv, self.wo, self.wgu, self.wdown)
        if not all(isinstance(w, torch.Tensor) for w in weights):
            raise TypeError("only float Linears can be packed in column tiles")
        self.wqkv, self.wo, self.wgu, self.wdown = (
            TiledLinear.of(w) for w in weights if isinstance(w, torch.Tensor)
        )

    def tensors(self) -> list[Weight | None]:
        return [self.in_norm, self.post_norm, self.wqkv, self.bqkv, self.wo, self.bo, self.wgu, self.wdown]


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


def fuse_layer(layer: Any) -> LlamaLayer:
    """Fused weights for one layer, made once per model: afterwards the model's own q/k/v and
    gate/up weights are views into the fused tensors, so no weight is held twice."""
    a, m = layer.self_attn, layer.mlp
    wqkv = _fused_parameter([a.q_proj, a.k_proj, a.v_proj], "weight")
    bias = _fused_parameter([a.q_proj, a.k_proj, a.v_proj], "bias") if a.q_proj.bias is not None else None
    return LlamaLayer(
        in_norm=layer.input_layernorm.weight,
        post_norm=layer.post_attention_layernorm.weight,
        wqkv=wqkv,
        bqkv=bias,
        wo=a.o_proj.weight,
        bo=a.o_proj.bias,
        wgu=_fused_parameter([m.gate_proj, m.up_proj], "weight"),
        wdown=m.down_proj.weight,
    )


def int8_layers(
    model: Any, tokenizer: Any, dtype: torch.dtype
) -> tuple[list[LlamaLayer], torch.Tensor, Int8Weight]:
    """Layers, final norm and lm_head over the model's int8 copy (engine.quant.model), whose norm
    weights carry its smoothing; the model itself is only read."""
    int8 = int8_model(model, tokenizer)
    layers = []
    for layer, q in zip(model.model.layers, int8.layers):
        a = layer.self_attn
        bias = None
        if a.q_proj.bias is not None:
            bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach()
        bo = None if a.o_proj.bias is None else a.o_proj.bias.detach()
        in_norm, post_norm = q.in_norm.to(dtype), q.post_norm.to(dtype)
        layers.append(LlamaLayer(in_norm, post_norm, q.qkv, bias, q.o, bo, q.gate_up, q.down))
    return layers, int8.final_norm.to(dtype), int8.lm_head


def weight_bytes(held: list[Weight | None]) -> int:
    """Bytes of these weights: int8 and packed copies as they are, float tensors once per storage
    (a tied lm_head counts once)."""
    tensors: dict[int, int] = {}
    other = 0
    flat: list[Weight | None] = []
    for w in held:  # tensors the native decode step holds too count once
        flat += w.parts if isinstance(w, Int8Tiled) else [w.tiles] if isinstance(w, TiledLinear) else [w]
        if isinstance(w, PackedLinear) and w.amx is not None:  # its AMX twin: the decode step's tiles
            flat.append(w.amx.tiles)
    for w in flat:
        if isinstance(w, (Int8Weight, PackedLinear)):
            other += w.nbytes
        elif isinstance(w, torch.Tensor):
            tensors[w.untyped_storage().data_ptr()] = w.untyped_storage().nbytes()
    return other + sum(tensors.values())


def drop_float_linears(model: Any) -> None:
    """Free the float weights of every projection once a runner holds its own copies (int8, or packed):
    the model can no longer run its own forward. The embedding, the norms and the lm_head stay."""
    modules = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        modules += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    for module in modules:
        module.weight = torch.nn.Parameter(module.weight.new_empty(0), requires_grad=False)
        for name in [n for n in vars(module) if n.startswith(_FUSED_MARKER)]:
            delattr(module, name)  # the fused copy it kept for later runners goes too


def _fused_parameter(modules: list[Any], name: str) -> torch.Tensor:
    """Concatenate ``module.<name>`` along rows and point each module at its slice of the result.

    Made once per model: later runners over the same model find the fused tensor and reuse it.
    """
    marker = f"{_FUSED_MARKER}{name}"
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
