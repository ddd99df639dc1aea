import itertools
import subprocess
import sys

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


FILLER = " ".join(f"Step {i}: stir the soup slowly and add a pinch of salt." for i in range(40))
LONG = f"{FILLER} Finally, remember that the capital of Australia is Canberra."


def test_windows_cover_a_long_text_with_overlap_and_fit_the_model(embedder):
    spans = embedder.window_spans(LONG)
    assert len(spans) > 1 and spans[0][0] == 0 and spans[-1][1] == len(LONG)
    tokenizer = embedder._model.tokenizer
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start < end  # consecutive windows overlap
    for a, b in spans:
        assert len(tokenizer(LONG[a:b], add_special_tokens=False)["input_ids"]) <= embedder.window_tokens
    assert embedder.window_spans("short text") == [(0, len("short text"))]


def test_windowed_vector_is_the_mean_of_its_windows_and_short_texts_are_unchanged(embedder):
    pooled = embedder.embed([LONG, "a short sentence"])
    windows, owners = embedder.embed_windows([LONG, "a short sentence"])
    assert owners.tolist() == [0] * (len(owners) - 1) + [1]
    mean = windows[owners == 0].mean(axis=0)
    np.testing.assert_allclose(pooled[0], mean / np.linalg.norm(mean), atol=1e-5)
    truncated = embedder.embed([LONG, "a short sentence"], long_texts="truncate")
    np.testing.assert_allclose(pooled[1], truncated[1], atol=1e-5)
    assert float(pooled[0] @ truncated[0]) < 0.999


def test_a_fact_at_the_end_of_a_long_text_counts_only_when_windowed(embedder):
    query = embedder.embed_query("What is the capital of Australia?")
    windowed = embedder.embed([LONG])[0]
    truncated = embedder.embed([LONG], long_texts="truncate")[0]
    assert float(query @ windowed) > float(query @ truncated) + 0.05


def test_bad_window_settings():
    with pytest.raises(ValueError, match="long_texts"):
        Embedder(long_texts="chop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window_overlap"):
        Embedder(window_overlap=-1)


FRESH_PROCESS = """
import os, sys, torch
from engine.openmp_pool import release_thread_pool
from rag.retrieval.embedder import Embedder

assert torch.get_num_threads() >= 2, "every machine this project runs on has 2 cores or more"
Embedder().embed(["a question long enough to be worth a parallel region " * 20] * 8)
after = len(os.listdir("/proc/self/task"))
release_thread_pool()  # frees nothing more if the embedding left no OpenMP workers on this thread
print(after - len(os.listdir("/proc/self/task")), "sentence_transformers" in sys.modules)
"""


def test_a_fresh_process_embedding_leaves_no_openmp_team_and_never_imports_sentence_transformers():
    # an API worker thread's team would throttle the engine thread's (engine/openmp_pool.py); the
    # bundled embedder runs on transformers alone (rag/retrieval/sentence_model.py), sparing each
    # process sentence-transformers' imports
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1].split() == ["0", "False"], (
        done.stdout,
        done.stderr[-2000:],
    )
