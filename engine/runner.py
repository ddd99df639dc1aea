"""ModelRunner: the forward passes. Prefill of an uncached suffix, decode of one token, logits only where needed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from engine.kv.codec import KVCodec
from engine.kv.state import KVBuffer
from engine.prefill_shapes import KEY_BLOCK, query_rows
from engine.row_tiles import TileMenu, linear_menu, tiled_linear
from engine.runners import RunnerCapabilities

log = logging.getLogger(__name__)


def prefix_reuse_blocker(config: Any) -> str | None:
    """Why this model's KV cache cannot be reused safely across requests, or None if it can.

    Reuse is exact only for full (global) causal attention with position-independent stored K/V.
    Sliding-window and hybrid / recurrent (linear-attention, SSM) layers keep state that a prefix
    match cannot reconstruct, so caching is turned off for them rather than risking wrong output.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "is_encoder_decoder", False):
        return "encoder-decoder models are not supported for prefix reuse"
    layer_types = getattr(text, "layer_types", None) or []
    unusual = sorted({t for t in layer_types if t != "full_attention"})
    if unusual:
        return f"layer types {unusual} keep state a prefix match cannot rebuild"
    window = getattr(text, "sliding_window", None)
    if window and getattr(text, "use_sliding_window", True):
        return f"sliding-window attention (window {window})"
    for attr in ("attention_chunk_size", "mamba_expand", "ssm_state_size", "linear_conv_kernel_dim"):
        if getattr(text, attr, None):
            return f"config.{attr} indicates non-standard attention state"
    return None


class ModelRunner:
    """Runs a Hugging Face causal LM for one sequence at a time over a :class:`KVBuffer`.

    Example:
        >>> runner = ModelRunner(loaded.model)               # doctest: +SKIP
        >>> buf = runner.new_buffer(capacity=2048)           # doctest: +SKIP
        >>> logits = runner.prefill([1, 2, 3], buf)          # [vocab], last position only
        >>> logits = runner.decode_step(int(logits.argmax()), buf)
    """

    capabilities = RunnerCapabilities()  # one forward per sequence, float weights, no stitching

    def __init__(self, model: Any, *, kv_codec: KVCodec | None = None) -> None:
        self.model = model
        self.kv_codec = kv_codec  # the buffer rounds every K/V written through it (KVBuffer.update)
        self.config = model.config
        text = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        self.num_layers = int(text.num_hidden_layers)
        self.vocab_size = int(text.vocab_size)
        self.max_context = int(
            getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None) or 2048
        )
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        # every Linear but the lm_head (which prefill runs on one row) gets its row-tile menu
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self.linears: list[tuple[torch.nn.Linear, TileMenu]] = [
            (m, linear_menu(m.in_features, m.out_features, m.weight.dtype))
            for m in model.modules()
            if isinstance(m, torch.nn.Linear) and m is not head and m.weight.numel()
        ]

    def new_buffer(self, capacity: int) -> KVBuffer:
        return KVBuffer(self.num_layers, capacity, self.kv_codec)

    def weight_bytes(self) -> int:
        """Bytes of the model's parameters (shared storage, such as a tied lm_head, counted once)."""
        storages = {
            p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in self.model.parameters()
        }
        return sum(storages.values())

    @torch.inference_mode()
    def forward(
        self,
        token_ids: Sequence[int],
        buffer: KVBuffer,
        logits_row: int = -1,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Extend ``buffer`` with ``token_ids``; return float32 logits ``[vocab]`` of one of their positions
        (default the last). ``attention_mask``: transformers' 2-d padding mask, ``[1, keys]``."""
        if len(token_ids) == 0:
            raise ValueError("forward needs at least one token")
        past = buffer.length
        if past + len(token_ids) > self.max_context:
            raise ValueError(
                f"sequence of {past + len(token_ids)} tokens exceeds the model's {self.max_context}"
            )
        # input_ids / position_ids: [1, S]
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        positions = torch.arange(past, past + len(token_ids), device=self.device).unsqueeze(0)
        keep = torch.tensor([logits_row % len(token_ids)], device=self.device)  # one head row, always
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=attention_mask,
            cache=buffer,
            use_cache=True,
            logits_to_keep=keep,
        )
        return out.logits[0, 0].float()

    def prefill(self, token_ids: Sequence[int], buffer: KVBuffer) -> torch.Tensor:
        """Prefill the uncached suffix (``buffer`` already holds the cached prefix).

        Runs engine.prefill_shapes' padded shapes (padding rows after the real ones, dropped again), so
        a token's KV and logits are the same bits however the prompt is split into calls.
        """
        past, s = buffer.length, len(token_ids)
        rows = max(s, min(query_rows(s), self.max_context - past))  # no padding past the context
        buffer.key_align = KEY_BLOCK
        # an all-ones padding mask over every key attention reads: transformers then builds a causal
        # mask instead of cutting the keys down to the queries for SDPA's is_causal
        keys = torch.ones(1, buffer.shown_keys(past + rows), dtype=torch.bool, device=self.device)
        try:
            with self._tiled_linears():
                logits = self.forward(list(token_ids) + [0] * (rows - s), buffer, s - 1, keys)
        finally:
            buffer.key_align = 1
        buffer.truncate(past + s)
        return logits

    @contextlib.contextmanager
    def _tiled_linears(self) -> Iterator[None]:
        """The model's Linears run their rows as row tiles (engine.row_tiles) for the duration."""
        for module, menu in self.linears:
            module.forward = _TiledForward(module, menu)  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            for module, _ in self.linears:
                del module.forward  # back to the class's own forward

    def decode_step(self, token_id: int, buffer: KVBuffer) -> torch.Tensor:
        return self.forward((token_id,), buffer)

    def decode_batch(self, token_ids: Sequence[int], buffers: Sequence[KVBuffer]) -> list[torch.Tensor]:
        """One decode step for several sequences (one forward each: HF attention has no ragged batch)."""
        return [self.decode_step(t, b) for t, b in zip(token_ids, buffers)]


class _TiledForward:
    """A Linear's forward over ``[..., in]`` as row tiles of its menu (a plain call for fewer rows)."""

    def __init__(self, module: torch.nn.Linear, menu: TileMenu) -> None:
        self.module = module
        self.menu = menu

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        rows = x.reshape(-1, m.in_features)
        out = tiled_linear(rows, m.weight, self.menu, m.bias)
        return out.view(*x.shape[:-1], m.out_features)
