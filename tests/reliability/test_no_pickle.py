"""Nothing user-supplied is ever unpickled.

How the index files are read (``KnowledgeBase.load`` -> ``rag.knowledge_base`` / ``rag.retrieval.index``), per saved
version directory ``<index_dir>/vNNNNNN/`` named by the plain-text pointer file ``CURRENT``:

- ``manifest.json``, ``documents.json``, ``chunks.json``, ``keys.json``, ``index.json``: ``json.loads``
  of UTF-8 text, then validated by pydantic models (``Document``, ``Chunk``, ``RAGConfig``);
- ``vectors.npy``: ``numpy.load(..., allow_pickle=False)``, a raw float array (an object array, which
  would need pickle, is refused with ValueError);
- ``hnsw.faiss`` (only for HNSW indexes): ``faiss.read_index``, FAISS's own binary format;
- ``extra.json`` and ``extra-<n>.npy`` (only with extra per-chunk vector sets): JSON, and float arrays
  read with ``allow_pickle=False``;
- the BM25 index is never stored: it is rebuilt from ``chunks.json`` on load;
- ``<index_dir>/LOCK`` is the writer's OS lock; only its holder's pid is read from it, as text.

Model weights are read by transformers / safetensors from the model directory the operator names;
the prefix KV cache lives in memory only. This module checks both sides: a scan of the source of
``rag/``, ``engine/`` and ``prefix_cache/`` for any way to unpickle, and a saved index that loads
with pickle disabled and refuses a pickle planted in its vector file.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import numpy as np
import pytest

from rag.knowledge_base import KnowledgeBase
from rag.stores.local.lock import LOCK_FILE
from rag.stores.local.versions import POINTER, current_version
from rag.types import Document

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rag", "engine", "prefix_cache")
PICKLING_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
INDEX_FILES = {
    "manifest.json",
    "documents.json",
    "chunks.json",
    "keys.json",
    "index.json",
    "vectors.npy",
    "hnsw.faiss",
    "extra.json",
}


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_const(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def unpickling_sites(source: str, filename: str) -> list[str]:
    """Every place in ``source`` that imports a pickling module or loads data in a way that may unpickle."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [
                f"{where} import {a.name}" for a in node.names if a.name.split(".")[0] in PICKLING_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PICKLING_MODULES:
            found.append(f"{where} from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            last = name.rsplit(".", 1)[-1]
            if name == "torch.load" and not _is_const(_keyword(node, "weights_only"), True):
                found.append(f"{where} torch.load without weights_only=True")
            elif name in ("np.load", "numpy.load") and not _is_const(_keyword(node, "allow_pickle"), False):
                found.append(f"{where} {name} without allow_pickle=False")
            elif last in ("read_pickle", "loads_pickle", "Unpickler") or name == "torch.jit.load":
                found.append(f"{where} {name}")
            elif last == "from_pretrained" and _is_const(_keyword(node, "use_safetensors"), False):
                found.append(f"{where} {name}(use_safetensors=False)")
    return found


def test_the_scanner_finds_what_it_looks_for():
    bad = (
        "import pickle\nfrom joblib import load\nimport torch\nimport numpy as np\n"
        "torch.load('x')\ntorch.load('x', weights_only=False)\nnp.load('x', allow_pickle=True)\nnp.load('x')\n"
        "pd.read_pickle('x')\nAutoModel.from_pretrained('x', use_safetensors=False)\n"
    )
    assert len(unpickling_sites(bad, "bad.py")) == 8
    good = "import numpy as np\nimport torch\nnp.load('x', allow_pickle=False)\ntorch.load('x', weights_only=True)\n"
    assert unpickling_sites(good, "good.py") == []


def test_no_source_file_can_unpickle():
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(files) > 30, files  # the scan really saw the packages
    sites = [
        s for p in files for s in unpickling_sites(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    ]
    print(f"no-pickle scan: {len(files)} files in {', '.join(PACKAGES)}, {len(sites)} unpickling sites")
    assert sites == []


class _Bomb:
    """Unpickling this creates a marker file: proof that something unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def saved_index(tmp_path_factory, embedder):
    from engine.models import load_tokenizer
    from rag.ingestion.chunking import Chunker

    root = tmp_path_factory.mktemp("nopickle") / "index"
    kb = KnowledgeBase(embedder=embedder, chunker=Chunker(load_tokenizer()))
    kb.add_documents(
        [Document(id=f"d{i}", text=f"Harbour note {i}: the ferry left at {7 + i}:40.") for i in range(4)]
    )
    kb.save(root)
    return root


def test_index_files_are_json_npy_and_faiss_and_load_with_pickle_disabled(saved_index, embedder, monkeypatch):
    version = current_version(saved_index)
    folder = version / "c0000"  # the default collection's files
    names = {p.name for p in version.iterdir()} | {p.name for p in folder.iterdir()}
    assert names <= INDEX_FILES | {"c0000"}, names
    assert {"manifest.json", "vectors.npy", "chunks.json"} <= names, names
    assert {p.name for p in saved_index.iterdir()} == {POINTER, LOCK_FILE, version.name}
    with (folder / "vectors.npy").open("rb") as fh:  # a plain float32 array: no pickled objects inside
        np.lib.format.read_magic(fh)
        header = np.lib.format.read_array_header_1_0(fh)
    assert header[2] == np.dtype(np.float32), header

    def refuse(*args, **kwargs):
        raise AssertionError("something tried to unpickle while loading the index")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    loaded = KnowledgeBase.load(saved_index, embedder=embedder)
    assert [d.id for d in loaded.list_documents()] == ["d0", "d1", "d2", "d3"]
    assert loaded.search("When did ferry 2 leave?", 1)[0].doc_id == "d2"


def test_a_pickle_planted_in_the_vector_file_is_refused_not_run(saved_index, embedder, tmp_path):
    vectors = current_version(saved_index) / "c0000" / "vectors.npy"
    marker = tmp_path / "unpickled"
    original = vectors.read_bytes()
    try:
        np.save(vectors, np.array([_Bomb(marker)], dtype=object), allow_pickle=True)
        with pytest.raises(ValueError, match="pickle"):
            KnowledgeBase.load(saved_index, embedder=embedder)
        assert not marker.exists()
    finally:
        vectors.write_bytes(original)
