"""The needle workload (pure: no model) and the fidelity metrics."""

from __future__ import annotations

import pytest
import torch

from rag.benchmark.fidelity import kl_divergence, rouge_l
from rag.benchmark.needle import make_needles, needle_layouts
from rag.types import ScoredChunk

DISTRACTORS = [ScoredChunk(doc_id=f"d{i}", chunk_id=f"c{i}", score=0.0, text=f"text {i}") for i in range(6)]


def test_needles_are_distinct_seeded_and_answerable_only_from_their_chunk():
    needles = make_needles(12, seed=3)
    assert make_needles(12, seed=3) == needles and make_needles(12, seed=4) != needles
    assert len({n.answer for n in needles}) == 12 and len({n.question for n in needles}) == 12
    for needle in needles:
        assert needle.answer in needle.chunk.text and needle.answer not in needle.question
        assert needle.question.split(" of the ")[1].rstrip("?") in needle.chunk.text


def test_layouts_put_the_needle_at_every_position_in_turn():
    layouts = needle_layouts(make_needles(8), DISTRACTORS, k=3)
    assert [position for _, _, position in layouts] == [2, 3, 4, 1, 2, 3, 4, 1]
    for needle, chunks, position in layouts:
        assert len(chunks) == 4 and chunks[position - 1] == needle.chunk
        assert len({c.chunk_id for c in chunks}) == 4
    with pytest.raises(ValueError, match="distractors"):
        needle_layouts(make_needles(1), DISTRACTORS[:2], k=3)


def test_rouge_l_and_kl():
    assert rouge_l("a b c", "a b c") == 1.0 and rouge_l("", "") == 1.0 and rouge_l("x", "y") == 0.0
    assert rouge_l("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(5 / 6)
    p = torch.log_softmax(torch.tensor([2.0, 0.0, -1.0]), -1)
    assert kl_divergence(p, p) == pytest.approx(0.0, abs=1e-7)
    assert kl_divergence(p, torch.log_softmax(torch.tensor([0.0, 0.0, 0.0]), -1)) > 0
