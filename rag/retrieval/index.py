"""FAISS vector index keyed by string ids: add / search / delete / write / read, no pickle.

The numpy arrays (vectors, keys) are the source of truth; the FAISS structure is derived from them.
While small the index is exact (``IndexIDMap2`` over ``IndexFlatIP``, whose ids support
``remove_ids``); from ``hnsw_threshold`` vectors on it is an ``IndexHNSWFlat`` (inner product).
HNSW cannot remove ids, so deletes there are tombstones filtered out at search time and the graph is
rebuilt from the stored vectors once a fifth of it is dead. A key may own several vectors (a chunk
embedded as a few windows, say); search returns each key once, with its best score.

Example:
    >>> index = VectorIndex(dim=384)
    >>> index.add(["c1", "c2"], vectors)                      # doctest: +SKIP
    >>> index.search(query_vector, k=1)                       # doctest: +SKIP
    [('c1', 0.83)]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

IndexKind = Literal["auto", "flat", "hnsw"]
_DEAD_FRACTION_REBUILD = 0.2
HNSW_M = 32
# ef_search: chosen on the tuning questions, the smallest breadth meeting the scale run's ANN recall target
EF_SEARCH = 256
EF_CONSTRUCTION = 200


class VectorIndex:
    """Inner-product search over unit vectors with string keys and deletion.

    ``kind="auto"`` picks flat (exact) below ``hnsw_threshold`` live vectors and HNSW at or above it
    (and back to flat below half the threshold); ``"flat"`` or ``"hnsw"`` force one.

    Example:
        >>> index = VectorIndex(dim=2, kind="flat")
        >>> index.add(["a", "b"], np.array([[1, 0], [0, 1]], dtype=np.float32))
        >>> index.search(np.array([0.9, 0.1], dtype=np.float32), k=1)
        [('a', 0.8999999761581421)]
        >>> index.delete(["a"]), len(index)
        (1, 1)
    """

    def __init__(
        self,
        dim: int,
        kind: IndexKind = "auto",
        hnsw_threshold: int = 50_000,
        hnsw_m: int = HNSW_M,
        ef_search: int = EF_SEARCH,
        ef_construction: int = EF_CONSTRUCTION,
    ) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be > 0, got {dim}")
        if kind not in ("auto", "flat", "hnsw"):
            raise ValueError(f"kind must be 'auto', 'flat' or 'hnsw', got {kind!r}")
        if hnsw_threshold <= 0:
            raise ValueError(f"hnsw_threshold must be > 0, got {hnsw_threshold}")
        self.dim = dim
        self.requested_kind: IndexKind = kind
        self.hnsw_threshold = hnsw_threshold
        self.hnsw_params = {"m": hnsw_m, "ef_search": ef_search, "ef_construction": ef_construction}
        self._vectors = np.zeros((0, dim), dtype=np.float32)  # [rows, dim]; row = faiss id
        self._keys: list[str] = []  # [rows]
        self._live = np.zeros(0, dtype=bool)  # [rows]
        self._rows: dict[str, list[int]] = {}  # key -> its live rows
        self.kind: Literal["flat", "hnsw"] = "hnsw" if kind == "hnsw" else "flat"
        self._faiss: Any = self._empty_faiss(self.kind)

    # -- size -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of live vectors."""
        return int(self._live.sum())

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def keys(self) -> list[str]:
        """Keys with at least one live vector."""
        return list(self._rows)

    # -- mutation ---------------------------------------------------------------------------------
    def add(self, keys: Sequence[str], vectors: np.ndarray) -> None:
        """Append ``vectors[i]`` under ``keys[i]`` (a key may repeat, or already exist)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape [n, {self.dim}], got {list(vectors.shape)}")
        if len(keys) != len(vectors):
            raise ValueError(f"got {len(keys)} keys for {len(vectors)} vectors")
        if not len(keys):
            return
        first = len(self._keys)
        rows = np.arange(first, first + len(keys), dtype=np.int64)
        self._vectors = np.concatenate([self._vectors, vectors])
        self._keys.extend(keys)
        self._live = np.concatenate([self._live, np.ones(len(keys), dtype=bool)])
        for key, row in zip(keys, rows.tolist(), strict=True):
            self._rows.setdefault(key, []).append(row)
        if self._target_kind() != self.kind:
            self._rebuild()
        elif self.kind == "flat":
            self._faiss.add_with_ids(vectors, rows)
        else:
            self._faiss.add(vectors)  # HNSW labels are insertion order == row

    def delete(self, keys: Iterable[str]) -> int:
        """Remove every vector of these keys (unknown keys are ignored); return vectors removed."""
        rows = [row for key in keys for row in self._rows.pop(key, [])]
        if not rows:
            return 0
        self._live[rows] = False
        if self.kind == "flat":
            self._faiss.remove_ids(np.asarray(rows, dtype=np.int64))
        dead = len(self._keys) - len(self)
        if self._target_kind() != self.kind or (
            self.kind == "hnsw" and dead > _DEAD_FRACTION_REBUILD * len(self._keys)
        ):
            self._rebuild()
        return len(rows)

    # -- search -----------------------------------------------------------------------------------
    def search(self, query: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The ``k`` best keys for a ``[dim]`` query, as (key, inner product), best first."""
        if k <= 0:
            raise ValueError(f"k must be > 0, got {k}")
        query = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)  # [1, dim]
        if query.shape[1] != self.dim:
            raise ValueError(f"query must have {self.dim} dimensions, got {query.shape[1]}")
        total = self._faiss.ntotal
        fetch = min(total, 4 * k + (len(self._keys) - len(self) if self.kind == "hnsw" else 0))
        while True:
            best = self._collect(query, fetch, k)
            if len(best) >= k or fetch >= total:
                return best
            fetch = min(total, 2 * fetch)

    def _collect(self, query: np.ndarray, fetch: int, k: int) -> list[tuple[str, float]]:
        if fetch == 0:
            return []
        scores, rows = self._faiss.search(query, fetch)  # [1, fetch] each
        best: dict[str, float] = {}
        for score, row in zip(scores[0].tolist(), rows[0].tolist(), strict=True):
            if row < 0 or not self._live[row]:
                continue
            key = self._keys[row]
            if key not in best:  # results are sorted: the first one seen is the key's best
                best[key] = score
                if len(best) == k:
                    break
        return list(best.items())

    def set_ef_search(self, ef_search: int) -> None:
        """HNSW search breadth (higher: closer to exact, slower); kept for a flat index until it turns HNSW."""
        if ef_search <= 0:
            raise ValueError(f"ef_search must be > 0, got {ef_search}")
        self.hnsw_params["ef_search"] = ef_search
        if self.kind == "hnsw":
            self._faiss.hnsw.efSearch = ef_search

    def best_scores(self, query: np.ndarray, keys: Sequence[str]) -> dict[str, float]:
        """Exact inner product of ``query`` with each known key's best vector, in one matrix product."""
        rows: list[int] = []
        owners: list[int] = []
        for i, key in enumerate(keys):
            own = self._rows.get(key, [])
            rows.extend(own)
            owners.extend([i] * len(own))
        if not rows:
            return {}
        sims = self._vectors[rows] @ np.asarray(query, dtype=np.float32)  # [rows]
        best = np.full(len(keys), -np.inf, dtype=np.float32)
        np.maximum.at(best, owners, sims)
        return {key: float(best[i]) for i, key in enumerate(keys) if key in self._rows}

    def vectors_of(self, key: str) -> np.ndarray:
        """The ``[n, dim]`` live vectors stored under ``key`` (n = 0 if unknown)."""
        return self._vectors[self._rows.get(key, [])]

    # -- structure --------------------------------------------------------------------------------
    def _target_kind(self) -> Literal["flat", "hnsw"]:
        if self.requested_kind != "auto":
            return self.requested_kind
        n, threshold = len(self), self.hnsw_threshold
        if self.kind == "hnsw":
            return "hnsw" if n >= threshold // 2 else "flat"
        return "hnsw" if n >= threshold else "flat"

    def _empty_faiss(self, kind: str) -> Any:
        import faiss

        if kind == "flat":
            return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        index = faiss.IndexHNSWFlat(self.dim, self.hnsw_params["m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.hnsw_params["ef_construction"]
        index.hnsw.efSearch = self.hnsw_params["ef_search"]
        return index

    def _rebuild(self) -> None:
        """Drop dead rows and rebuild the FAISS structure of the right kind from the stored vectors."""
        live = np.flatnonzero(self._live)
        self._vectors = np.ascontiguousarray(self._vectors[live])
        self._keys = [self._keys[i] for i in live.tolist()]
        self._live = np.ones(len(self._keys), dtype=bool)
        self._rows = {}
        for row, key in enumerate(self._keys):
            self._rows.setdefault(key, []).append(row)
        self.kind = self._target_kind()
        self._faiss = self._empty_faiss(self.kind)
        self._add_all_to_faiss()

    def _add_all_to_faiss(self) -> None:
        if not len(self._keys):
            return
        if self.kind == "flat":
            self._faiss.add_with_ids(self._vectors, np.arange(len(self._keys), dtype=np.int64))
        else:
            self._faiss.add(self._vectors)

    # -- persistence ------------------------------------------------------------------------------
    def write(self, directory: Path) -> None:
        """Write ``vectors.npy``, ``keys.json``, ``index.json`` (and ``hnsw.faiss``) into directory."""
        import faiss

        if len(self) != len(self._keys):
            self._rebuild()  # compact: only live rows are written
        np.save(directory / "vectors.npy", self._vectors, allow_pickle=False)
        (directory / "keys.json").write_text(json.dumps(self._keys), encoding="utf-8")
        meta = {
            "dim": self.dim,
            "kind": self.kind,
            "requested_kind": self.requested_kind,
            "hnsw_threshold": self.hnsw_threshold,
            **self.hnsw_params,
        }
        (directory / "index.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        if self.kind == "hnsw":
            faiss.write_index(self._faiss, str(directory / "hnsw.faiss"))

    @classmethod
    def read(
        cls, directory: Path, kind: IndexKind | None = None, hnsw_threshold: int | None = None
    ) -> VectorIndex:
        """Load what ``write`` wrote; ``kind``/``hnsw_threshold`` override the saved choice."""
        import faiss

        meta = json.loads((directory / "index.json").read_text(encoding="utf-8"))
        index = cls(
            dim=meta["dim"],
            kind=kind or meta["requested_kind"],
            hnsw_threshold=hnsw_threshold or meta["hnsw_threshold"],
            hnsw_m=meta["m"],
            ef_search=meta["ef_search"],
            ef_construction=meta["ef_construction"],
        )
        vectors = np.load(directory / "vectors.npy", allow_pickle=False)
        keys = json.loads((directory / "keys.json").read_text(encoding="utf-8"))
        if vectors.shape != (len(keys), index.dim):
            raise ValueError(f"{directory}: vectors.npy has shape {vectors.shape} for {len(keys)} keys")
        index._vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        index._keys = list(keys)
        index._live = np.ones(len(keys), dtype=bool)
        for row, key in enumerate(index._keys):
            index._rows.setdefault(key, []).append(row)
        index.kind = index._target_kind()
        saved_graph = directory / "hnsw.faiss"
        graph = faiss.read_index(str(saved_graph)) if index.kind == "hnsw" and saved_graph.is_file() else None
        if graph is not None and graph.ntotal == len(keys):
            index._faiss = graph
            index._faiss.hnsw.efSearch = index.hnsw_params["ef_search"]
        else:
            index._faiss = index._empty_faiss(index.kind)
            index._add_all_to_faiss()
        return index
