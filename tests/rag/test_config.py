import pytest

from rag.config import RAGConfig


def test_defaults_are_the_measured_ones():
    cfg = RAGConfig()
    assert (cfg.chunk_size, cfg.chunk_overlap, cfg.top_k) == (256, 32, 4)
    assert (cfg.retrieval_mode, cfg.fusion, cfg.dense_weight) == ("hybrid", "weighted", 0.7)
    assert cfg.title_in_embedding and cfg.reranker == "none" and cfg.index_kind == "auto"
    assert (cfg.long_chunks, cfg.max_chunks_per_document) == ("windows", 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk_size": 32, "chunk_overlap": 32}, "chunk_overlap"),
        ({"top_k": 0}, "top_k"),
        ({"retrieval_mode": "sparse"}, "retrieval_mode"),
        ({"dense_weight": 1.5}, "dense_weight"),
        ({"reranker": "cross-encoder"}, "reranker_model"),
        ({"no_such_knob": 1}, "no_such_knob"),
    ],
)
def test_bad_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RAGConfig(**kwargs)
