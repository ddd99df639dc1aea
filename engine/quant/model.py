"""The int8 copy of a Llama-family model: smoothed, quantized, cached once per model directory.

For each layer: q/k/v (fused), o, gate/up (fused) and down as per-channel int8 (engine.quant.linear;
down with a residual digit, as its rounding moves the model's answers most), with SmoothQuant's
channel scales (engine.quant.smooth) folded into the two RMSNorm weights and the up
projection's rows; the lm_head as int8 too, its smoothing folded into the final RMSNorm weight. The first load converts and writes the result under
``$PREFIXRAG_HOME/quantized`` (engine.quant.store) with a progress line; later loads read it back.
The model's own weights are only read, never changed.

Example:
    >>> layers, lm_head = int8_model(loaded.model, loaded.tokenizer)   # doctest: +SKIP
    >>> layers[0].qkv.out_features                                     # doctest: +SKIP
    960
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.quant.linear import Int8Weight, int8_backend, pack_int8, quantize_rows
from engine.quant.smooth import (
    ALPHA,
    CALIBRATION_TOKENS,
    CALIBRATION_TOPICS,
    calibrate,
    calibration_ids,
    smoothing,
)
from engine.quant.store import Spec, cache_path_for, load_or_build

RECIPE = f"int8-v4 residual-down smoothquant alpha={ALPHA} calibration={','.join(CALIBRATION_TOPICS)}:{CALIBRATION_TOKENS}"
MATRICES = ("qkv", "o", "gate_up", "down")
RESIDUAL = frozenset({"down"})  # matrices kept with a residual digit: their rounding moves answers most


@dataclass(frozen=True)
class Int8Layer:
    """One decoder layer's int8 projections and the RMSNorm weights that go with them."""

    in_norm: torch.Tensor  # the input RMSNorm weight, q/k/v smoothing folded in
    post_norm: torch.Tensor  # the post-attention RMSNorm weight, gate/up smoothing folded in
    qkv: Int8Weight
    o: Int8Weight
    gate_up: Int8Weight
    down: Int8Weight


@dataclass(frozen=True)
class Int8Model:
    """The int8 layers, the int8 lm_head and the final RMSNorm weight that goes with it."""

    layers: list[Int8Layer]
    final_norm: torch.Tensor
    lm_head: Int8Weight


# One int8 copy per model object in a process, shared by the runners over it: packing it for the
# backend is the slow part of making a runner, and a runner only reads it (it makes its own layers and
# tiles from it).
_copies: weakref.WeakKeyDictionary[Any, tuple[str | None, Int8Model]] = weakref.WeakKeyDictionary()
_copies_lock = threading.Lock()


def int8_model(model: Any, tokenizer: Any) -> Int8Model:
    """The int8 copy of ``model`` (converted on first use, then read from the cache; packed once per
    model object in a process)."""
    backend = int8_backend()
    with _copies_lock:
        held = _copies.get(model)
        if held is None or held[0] != backend:
            held = _copies[model] = (backend, _packed(model, tokenizer))
        return held[1]


def _packed(model: Any, tokenizer: Any) -> Int8Model:
    path = cache_path_for(getattr(model, "name_or_path", None), RECIPE)
    tensors = load_or_build(path, _spec(model), lambda: _convert(model, tokenizer))
    layers = [
        Int8Layer(
            in_norm=tensors[f"layers.{i}.in_norm"],
            post_norm=tensors[f"layers.{i}.post_norm"],
            **{
                m: pack_int8(tensors[f"layers.{i}.{m}.q"], tensors[f"layers.{i}.{m}.scale"]) for m in MATRICES
            },
        )
        for i in range(len(model.model.layers))
    ]
    return Int8Model(layers, tensors["final_norm"], pack_int8(tensors["lm_head.q"], tensors["lm_head.scale"]))


def _spec(model: Any) -> Spec:
    """Every tensor the int8 copy holds, with its dtype and shape (read from the model, not computed)."""
    spec: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}

    def matrix(name: str, out: int, inp: int) -> None:
        digits = 2 if name.rsplit(".", 1)[-1] in RESIDUAL else 1
        spec[f"{name}.q"] = (torch.int8, (digits * out, inp))
        spec[f"{name}.scale"] = (torch.float32, (out,))

    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        hidden = a.q_proj.weight.shape[1]
        qkv_out = sum(p.weight.shape[0] for p in (a.q_proj, a.k_proj, a.v_proj))
        matrix(f"layers.{i}.qkv", qkv_out, hidden)
        matrix(f"layers.{i}.o", a.o_proj.weight.shape[0], a.o_proj.weight.shape[1])
        matrix(f"layers.{i}.gate_up", m.gate_proj.weight.shape[0] + m.up_proj.weight.shape[0], hidden)
        matrix(f"layers.{i}.down", m.down_proj.weight.shape[0], m.down_proj.weight.shape[1])
        spec[f"layers.{i}.in_norm"] = (torch.float32, (hidden,))
        spec[f"layers.{i}.post_norm"] = (torch.float32, (hidden,))
    matrix("lm_head", *model.lm_head.weight.shape)
    spec["final_norm"] = (torch.float32, (model.lm_head.weight.shape[1],))
    return spec


def _convert(model: Any, tokenizer: Any) -> dict[str, torch.Tensor]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    layers = model.model.layers
    out: dict[str, torch.Tensor] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("int8 weights (one-time): calibrating", total=len(layers) + 2)
        peaks = calibrate(model, calibration_ids(tokenizer))
        bar.update(task, advance=1, description="int8 weights (one-time): quantizing")
        for i, layer in enumerate(layers):
            out.update(_layer_tensors(i, layer, peaks))
            bar.advance(task)
        head = model.lm_head.weight.detach().float()
        s_head = smoothing(peaks["lm_head"], head)
        out["lm_head.q"], out["lm_head.scale"] = quantize_rows(head * s_head)
        out["final_norm"] = model.model.norm.weight.detach().float() / s_head
        bar.update(task, advance=1, description="int8 weights (one-time): saving")
    return out


@torch.no_grad()
def _layer_tensors(i: int, layer: Any, peaks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    a, m = layer.self_attn, layer.mlp
    wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).float()
    wgu = torch.cat([m.gate_proj.weight, m.up_proj.weight]).float()
    wdown = m.down_proj.weight.float()
    s_in = smoothing(peaks[f"layers.{i}.qkv"], wqkv)
    s_post = smoothing(peaks[f"layers.{i}.gate_up"], wgu)
    s_down = smoothing(peaks[f"layers.{i}.down"], wdown)
    up = wgu[m.gate_proj.weight.shape[0] :]
    up /= s_down[:, None]  # silu(gate) * up / s_down: the down input arrives divided
    tensors = {
        f"layers.{i}.in_norm": layer.input_layernorm.weight.float() / s_in,
        f"layers.{i}.post_norm": layer.post_attention_layernorm.weight.float() / s_post,
    }
    scaled: dict[str, Callable[[], torch.Tensor]] = {
        "qkv": lambda: wqkv * s_in,
        "o": lambda: a.o_proj.weight.float(),
        "gate_up": lambda: wgu * s_post,
        "down": lambda: wdown * s_down,
    }
    for name, weight in scaled.items():
        q, scale = quantize_rows(weight(), residual=name in RESIDUAL)
        tensors[f"layers.{i}.{name}.q"], tensors[f"layers.{i}.{name}.scale"] = q, scale
    return tensors
