"""The reranker's answer-accuracy target reads its row either way round: the reranked row against a
first-stage default, or the first-stage row against a reranking default."""

from __future__ import annotations

from rag.benchmark.quality_report import quality_targets


def _section(rerank: bool, row_accuracy: float, reference_accuracy: float) -> dict:
    name = "full prefill, embedding reranker" if rerank else "full prefill, first stage only"
    return {
        "agreement_tokens": 16,
        "settings": {
            "full prefill": {"group": "reference", "accuracy": 0.5},
            name: {
                "group": "retrieval",
                "questions": 8,
                "rerank": rerank,
                "accuracy": row_accuracy,
                "reference_accuracy": reference_accuracy,
            },
        },
    }


def test_a_reranked_row_is_met_when_it_answers_no_worse_than_the_first_stage_default():
    (met,) = quality_targets(_section(True, 0.375, 0.25))
    assert (
        met["met"] and met["value"] == 0.125 and met["target"].startswith("full prefill, embedding reranker")
    )
    (missed,) = quality_targets(_section(True, 0.25, 0.375))
    assert not missed["met"]


def test_a_first_stage_row_judges_the_reranking_default_the_other_way_round():
    (met,) = quality_targets(_section(False, 0.25, 0.375))  # the default (reranked) answers better
    assert met["met"] and met["value"] == 0.125 and "the embedding reranker (default)" in met["target"]
    (missed,) = quality_targets(_section(False, 0.375, 0.25))
    assert not missed["met"] and missed["value"] == -0.125
