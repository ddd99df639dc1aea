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


def test_top_k_has_one_default_and_one_rule():
    cfg = RAGConfig(top_k=6)
    assert cfg.resolve_top_k(None) == 6 and cfg.resolve_top_k(2) == 2
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="top_k must be a positive integer"):
            cfg.resolve_top_k(bad)  # type: ignore[arg-type]


def test_sampling_params_keep_every_setting_when_the_cap_changes():
    cfg = RAGConfig(max_tokens=100, temperature=0.3, repetition_penalty=1.25)
    default, capped = cfg.sampling_params(), cfg.sampling_params(max_tokens=7)
    assert (default.max_tokens, capped.max_tokens) == (100, 7)
    for p in (default, capped):
        assert (p.temperature, p.repetition_penalty) == (0.3, 1.25)
