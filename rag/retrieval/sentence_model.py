"""A sentence-transformers model directory run on transformers alone.

The common layout, a Transformer module then a Pooling module (CLS, mean or max) and optionally a
Normalize module, is three operations on top of the Hugging Face encoder: tokenize (truncated to the
directory's ``max_seq_length``, lower-cased where it says so), run the encoder, pool over the
attention mask. ``SentenceModel`` does exactly that, so loading the embedder does not import the
sentence-transformers package, which pulls scipy and scikit-learn with it: seconds of every process
start. Where the native float32 kernels run (``engine.native.linear``), the encoder's Linears multiply
in their column tiles on calls of up to ``TILED_ROWS`` rows (a query's few rows, where torch's GEMM is
slower); larger ingestion batches stay with torch's GEMM, which is faster there. A directory with any
other module (Dense, a weighted pooling, a custom class) gets ``None`` from ``SentenceModel.load`` and
the caller uses sentence-transformers itself.

Example:
    >>> model = SentenceModel.load(Path("/models/all-MiniLM-L6-v2"))   # doctest: +SKIP
    >>> model.encode(["a cat sat"], batch_size=64, normalize_embeddings=True).shape  # doctest: +SKIP
    (1, 384)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.native.build import NativeBuildError
from engine.native.linear import TILE_COLUMNS, TiledLinear, preferred

POOLINGS = ("cls", "mean", "max")
TILED_ROWS = 512  # rows per Linear call up to which the native tiles multiply (a query, a few chunks)


class SentenceModel:
    """Tokenizer, encoder and pooling of a plain sentence-transformers directory; ``encode`` has the
    shape of ``SentenceTransformer.encode`` for what the embedder asks of it.

    Example:
        >>> model = SentenceModel.load(path)                        # doctest: +SKIP
        >>> model.max_seq_length, model.get_embedding_dimension()   # doctest: +SKIP
        (256, 384)
    """

    def __init__(
        self, tokenizer: Any, encoder: Any, pooling: str, max_seq_length: int, lower_case: bool
    ) -> None:
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.pooling = pooling
        self.max_seq_length = max_seq_length
        self.lower_case = lower_case
        self.linear_kernel = "native" if _tile_linears(encoder) else "torch"  # what multiplies its Linears

    @classmethod
    def load(cls, path: Path) -> SentenceModel | None:
        """The model in ``path``, or None when its modules are not Transformer, Pooling (CLS, mean or
        max) and an optional Normalize."""
        layout = _layout(path)
        if layout is None:
            return None
        from transformers import AutoModel, AutoTokenizer

        transformer_dir, pooling = layout
        settings = _read_json(transformer_dir / "sentence_bert_config.json") or {}
        tokenizer = AutoTokenizer.from_pretrained(transformer_dir)
        encoder = AutoModel.from_pretrained(transformer_dir).eval()
        limit = settings.get("max_seq_length") or min(
            tokenizer.model_max_length, encoder.config.max_position_embeddings
        )
        return cls(tokenizer, encoder, pooling, int(limit), bool(settings.get("do_lower_case", False)))

    def get_embedding_dimension(self) -> int:
        return int(self.encoder.config.hidden_size)

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int,
        normalize_embeddings: bool = True,
        show_progress_bar: bool = False,
        **_: Any,
    ) -> np.ndarray:
        """``[len(texts), dim]`` float32 vectors, batched longest first (less padding), in input order."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), self.get_embedding_dimension()), dtype=np.float32)
        starts = range(0, len(order), batch_size)
        for start in _progress(starts, show_progress_bar):
            batch = order[start : start + batch_size]
            out[batch] = self._encode_batch([texts[i] for i in batch], normalize_embeddings)
        return out

    def _encode_batch(self, texts: list[str], normalize: bool) -> np.ndarray:
        if self.lower_case:
            texts = [t.lower() for t in texts]
        inputs = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_seq_length, return_tensors="pt"
        )
        with torch.inference_mode():
            hidden = self.encoder(**inputs).last_hidden_state  # [batch, tokens, dim]
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            elif self.pooling == "max":
                pooled = hidden.masked_fill(mask == 0, float("-inf")).amax(dim=1)
            else:
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().numpy()


class TiledLinearModule(torch.nn.Module):
    """A float32 Linear that multiplies up to ``TILED_ROWS`` rows in the native column tiles
    (engine.native.linear) and more with torch's GEMM."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach()
        self.tiles = TiledLinear.of(self.weight)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > TILED_ROWS:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        out: torch.Tensor = self.tiles(rows, self.bias)
        return out.view(*x.shape[:-1], self.out_features)


def _tile_linears(encoder: Any) -> int:
    """Swap a float32 encoder's Linears for tiled ones where the native kernels run; how many."""
    if next(encoder.parameters()).dtype != torch.float32 or not preferred(torch.float32):
        return 0
    swapped = 0
    for module in list(encoder.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child.out_features % TILE_COLUMNS == 0:
                try:
                    setattr(module, name, TiledLinearModule(child))
                except NativeBuildError:
                    return swapped
                swapped += 1
    return swapped


def _layout(path: Path) -> tuple[Path, str] | None:
    """(the Transformer module's directory, the pooling) of a plain directory, else None."""
    modules = _read_json(path / "modules.json")
    if not isinstance(modules, list) or not modules:
        return None
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return None
    pooling = _pooling(_read_json(path / modules[1].get("path", "") / "config.json") or {})
    if pooling is None:
        return None
    return path / modules[0].get("path", ""), pooling


def _pooling(config: dict[str, Any]) -> str | None:
    """The one pooling a Pooling module's config turns on, if it is CLS, mean or max: in the
    ``pooling_mode`` key, or in the older ``pooling_mode_<name>_token(s)`` flags."""
    mode = config.get("pooling_mode")
    if mode is None:
        on = [key for key, value in config.items() if key.startswith("pooling_mode_") and value is True]
        mode = (
            on[0].removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
            if len(on) == 1
            else None
        )
    if mode not in POOLINGS or config.get("include_prompt") is False:
        return None
    return str(mode)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _progress(steps: range, show: bool) -> Any:
    if not show or len(steps) <= 1:
        return steps
    from rich.progress import track

    return track(steps, description="embedding", transient=True)
