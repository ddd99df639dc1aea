import json

import numpy as np
import pytest

from rag.retrieval.index import VectorIndex


def unit(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return [f"k{i}" for i in range(200)], unit(rng, 200)


def exact_top(vectors, keys, q, k):
    order = np.argsort(-(vectors @ q))[:k]
    return [keys[i] for i in order]


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_search_matches_brute_force(data, kind):
    keys, vectors = data
    index = VectorIndex(16, kind=kind)
    index.add(keys, vectors)
    assert index.kind == kind and len(index) == 200
    for q in vectors[:10]:
        assert [k for k, _ in index.search(q, 5)] == exact_top(vectors, keys, q, 5)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_delete_removes_keys_from_results(data, kind):
    keys, vectors = data
    index = VectorIndex(16, kind=kind)
    index.add(keys, vectors)
    assert index.delete(["k3", "k4", "unknown"]) == 2
    assert "k3" not in index and len(index) == 198
    hits = [k for k, _ in index.search(vectors[3], 10)]
    assert "k3" not in hits and "k4" not in hits and len(hits) == 10
    survivors = [k for k in keys if k not in ("k3", "k4")]
    alive = np.array([vectors[keys.index(k)] for k in survivors])
    assert hits == exact_top(alive, survivors, vectors[3], 10)


def test_hnsw_rebuilds_after_many_deletes(data):
    keys, vectors = data
    index = VectorIndex(16, kind="hnsw")
    index.add(keys, vectors)
    index.delete(keys[:100])
    assert index._faiss.ntotal == 100  # compacted: tombstones beyond 20 % trigger a rebuild
    assert {k for k, _ in index.search(vectors[0], 100)} == set(keys[100:])


def test_auto_switches_kind_by_size(data):
    keys, vectors = data
    index = VectorIndex(16, kind="auto", hnsw_threshold=100)
    index.add(keys[:99], vectors[:99])
    assert index.kind == "flat"
    index.add(keys[99:], vectors[99:])
    assert index.kind == "hnsw"
    index.delete(keys[:160])  # below threshold // 2
    assert index.kind == "flat" and len(index) == 40
    assert index.search(vectors[199], 1)[0][0] == "k199"


def test_a_key_with_several_vectors_is_returned_once_with_its_best_score(data):
    _, vectors = data
    index = VectorIndex(16, kind="flat")
    index.add(["a", "a", "b"], vectors[:3])
    hits = index.search(vectors[1], 3)
    assert [k for k, _ in hits] == ["a", "b"]
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert index.vectors_of("a").shape == (2, 16)
    assert index.delete(["a"]) == 2


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_write_read_round_trip_without_pickle(tmp_path, data, kind):
    keys, vectors = data
    index = VectorIndex(16, kind=kind)
    index.add(keys, vectors)
    index.delete(["k0"])
    index.write(tmp_path)
    assert np.load(tmp_path / "vectors.npy", allow_pickle=False).shape == (199, 16)
    assert json.loads((tmp_path / "keys.json").read_text())[0] == "k1"
    loaded = VectorIndex.read(tmp_path)
    assert loaded.kind == kind and len(loaded) == 199
    for q in vectors[:5]:
        assert loaded.search(q, 4) == index.search(q, 4)


def test_bad_inputs(data):
    keys, vectors = data
    index = VectorIndex(16)
    with pytest.raises(ValueError, match="shape"):
        index.add(keys[:2], vectors[:2, :8])
    with pytest.raises(ValueError, match="keys"):
        index.add(keys[:3], vectors[:2])
    with pytest.raises(ValueError, match="k must be > 0"):
        index.search(vectors[0], 0)
    with pytest.raises(ValueError, match="kind"):
        VectorIndex(16, kind="ivf")  # type: ignore[arg-type]
    assert index.search(vectors[0], 3) == []
