import json
import shutil

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from engine.native.linear import preferred
from rag.retrieval.embedder import Embedder
from rag.retrieval.sentence_model import SentenceModel

TEXTS = [
    "a cat sat",
    "How do I open a file for reading in Python?",
    "The Eiffel Tower is a landmark in Paris. " * 60,  # longer than the model reads: truncated alike
    "",
]


def _reference(path):
    return SentenceTransformer(str(path), device="cpu", local_files_only=True)


def _variant(tmp_path, source, pooling=None, modules=None):
    """A copy of the bundled directory (files linked) with another pooling config or module list."""
    target = tmp_path / "model"
    shutil.copytree(
        source, target, copy_function=lambda s, d: shutil.copy(s, d) if s.endswith(".json") else None
    )
    for item in source.iterdir():
        if not (target / item.name).exists():
            (target / item.name).symlink_to(item)
    if pooling is not None:
        (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if modules is not None:
        (target / "modules.json").write_text(json.dumps(modules))
    return target


def test_the_bundled_embedder_runs_on_transformers_alone_with_sentence_transformers_own_vectors(embedder):
    model = SentenceModel.load(embedder.path)
    assert model is not None and model.max_seq_length == 256 and model.get_embedding_dimension() == 384
    # its Linears multiply in the native float32 tiles wherever those are the runners' choice too
    assert model.linear_kernel == ("native" if preferred(torch.float32) else "torch")
    ours = model.encode(TEXTS, batch_size=2, normalize_embeddings=True)
    theirs = _reference(embedder.path).encode(
        TEXTS, batch_size=2, normalize_embeddings=True, convert_to_numpy=True
    )
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, atol=2e-6)


@pytest.mark.parametrize(
    "pooling",
    [
        {"word_embedding_dimension": 384, "pooling_mode_cls_token": True},
        {"word_embedding_dimension": 384, "pooling_mode_max_tokens": True},
        {"embedding_dimension": 384, "pooling_mode": "mean"},
    ],
)
def test_cls_max_and_the_newer_config_key_pool_as_sentence_transformers_does(tmp_path, embedder, pooling):
    path = _variant(tmp_path, embedder.path, pooling=pooling)
    model = SentenceModel.load(path)
    assert model is not None
    ours = model.encode(TEXTS, batch_size=3, normalize_embeddings=True)
    theirs = _reference(path).encode(TEXTS, batch_size=3, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, atol=2e-6)


def test_a_directory_with_other_modules_is_left_to_sentence_transformers(tmp_path, embedder):
    modules = json.loads((embedder.path / "modules.json").read_text())
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    path = _variant(tmp_path, embedder.path, modules=[*modules, dense])
    assert SentenceModel.load(path) is None
    sqrt_len = {"word_embedding_dimension": 384, "pooling_mode_mean_sqrt_len_tokens": True}
    assert SentenceModel.load(_variant(tmp_path / "b", embedder.path, pooling=sqrt_len)) is None
    # and the embedder still reads such a directory, through sentence-transformers
    weighted = _variant(tmp_path / "c", embedder.path, pooling=sqrt_len)
    expected = _reference(weighted).encode(["a cat sat"], normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(Embedder(str(weighted)).embed(["a cat sat"]), expected, atol=1e-6)
