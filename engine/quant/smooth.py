"""Smoothing (SmoothQuant): move activation outliers into the weights before int8 quantization.

A few input channels of a Linear carry much larger activations than the rest, token after token,
so one int8 scale per token spends its levels on them. Dividing channel ``j`` of the activations by
``s_j`` and multiplying column ``j`` of the weight by ``s_j`` leaves the product unchanged and evens
out both, with ``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)`` from a calibration pass. The division
costs nothing at run time: it folds into the RMSNorm weight before q/k/v, gate/up and the lm_head,
and into the up projection's rows before down (``silu(gate) * up`` is linear in ``up``).

Calibration reads Python-reference topics that the benchmark's fidelity prompts and corpus do not use.

Example:
    >>> peaks = calibrate(loaded.model, calibration_ids(loaded.tokenizer))     # doctest: +SKIP
    >>> s = smoothing(peaks["layers.0.qkv"], wqkv)                            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

ALPHA = 0.5  # SmoothQuant's default migration strength
CALIBRATION_TOPICS = ("import", "specialnames", "types", "numeric-types", "exceptions", "class")
CALIBRATION_TOKENS = 1024
_FLOOR = 1e-5  # a channel never seen active keeps a finite scale


def calibration_ids(tokenizer: Any, tokens: int = CALIBRATION_TOKENS) -> list[int]:
    """The calibration text: the first ``tokens`` tokens of a fixed run of Python-reference topics."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in CALIBRATION_TOPICS)
    return list(tokenizer.encode(text, add_special_tokens=False)[:tokens])


@torch.inference_mode()
def calibrate(model: Any, ids: list[int], window: int = 512) -> dict[str, torch.Tensor]:
    """Per input channel, the largest |activation| entering each layer's q/k/v, gate/up and down
    projections (``layers.{i}.qkv`` / ``.gate_up`` / ``.down``) and the lm_head (``lm_head``), over
    ``ids`` in windows."""
    peaks: dict[str, torch.Tensor] = {}

    def record(name: str) -> Any:
        def hook(_module: Any, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0)
            peaks[name] = torch.maximum(peaks[name], x) if name in peaks else x

        return hook

    handles = [model.lm_head.register_forward_pre_hook(record("lm_head"))]
    for i, layer in enumerate(model.model.layers):
        handles.append(layer.self_attn.q_proj.register_forward_pre_hook(record(f"layers.{i}.qkv")))
        handles.append(layer.mlp.gate_proj.register_forward_pre_hook(record(f"layers.{i}.gate_up")))
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(record(f"layers.{i}.down")))
    try:
        for start in range(0, len(ids), window):
            model(input_ids=torch.tensor([ids[start : start + window]]), use_cache=False, logits_to_keep=0)
    finally:
        for handle in handles:
            handle.remove()
    return peaks


def smoothing(activation_peak: torch.Tensor, weight: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """Per input channel ``[in]``: divide activations by it, multiply weight columns by it."""
    weight_peak = weight.detach().float().abs().amax(dim=0).clamp_min(_FLOOR)
    s = activation_peak.float().clamp_min(_FLOOR).pow(alpha) / weight_peak.pow(1 - alpha)
    return s.clamp_min(_FLOOR)
