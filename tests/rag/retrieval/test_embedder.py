import numpy as np
import pytest

from rag.retrieval.embedder import Embedder


def test_vectors_are_normalised_384d(embedder):
    vecs = embedder.embed(["The cat sat on the mat.", "Python lists are mutable sequences."])
    assert vecs.shape == (2, 384)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_paraphrase_ranks_above_unrelated(embedder):
    q, para, other = embedder.embed(
        [
            "How do I open a file for reading in Python?",
            "What is the way to read a file's contents using Python?",
            "The Eiffel Tower is a landmark in Paris.",
        ]
    )
    assert float(q @ para) > float(q @ other) + 0.2


def test_empty_input(embedder):
    assert embedder.embed([]).shape == (0, 384)


def test_any_sentence_transformers_dir_works(embedder):
    again = Embedder(str(embedder.path))
    np.testing.assert_allclose(again.embed(["hello"]), embedder.embed(["hello"]), atol=1e-6)


def test_bad_embedder_name():
    with pytest.raises(ValueError, match="sentence-transformers model directory"):
        Embedder("no-such-embedder")


def test_a_query_is_embedded_once_and_read_only(embedder):
    question = "How is a query vector reused between retrieval and source scores?"
    first = embedder.embed_query(question)
    assert embedder.embed_query(question) is first  # retrieval, then the sources' scores
    assert np.array_equal(first, embedder.embed([question])[0])
    with pytest.raises(ValueError):
        first[0] = 1.0
