"""The stitch plan: what chunks mode reuses, computes and may cache (pure; no model)."""

import pytest

from engine.chunks.plan import check_spans, plan_stitch


def test_chunk_right_after_the_anchor_is_computed_in_place():
    # anchor [0, 4), chunks [4, 8) (in place), [9, 14) and [15, 18), question [18, 20)
    plan = plan_stitch(20, [(4, 8), (9, 14), (15, 18)], cached=0)
    assert plan is not None
    assert plan.anchor == 4 and plan.exact_end == 9
    assert [(r.chunk, r.start, r.offset, r.length, r.delta) for r in plan.runs] == [
        (1, 9, 0, 5, 5),
        (2, 15, 0, 3, 11),
    ]
    assert plan.computed_positions() == [14, 18, 19]
    assert plan.reused_tokens == 8


def test_exact_match_covers_part_of_a_chunk():
    plan = plan_stitch(20, [(4, 8), (9, 14), (15, 18)], cached=11)
    assert plan is not None
    assert plan.exact_end == 11
    assert [(r.start, r.offset, r.length) for r in plan.runs] == [(11, 2, 3), (15, 0, 3)]


def test_nothing_to_stitch_is_prefix_mode():
    assert plan_stitch(20, [], cached=0) is None
    assert plan_stitch(20, [(4, 8)], cached=0) is None  # one chunk: it stands where it is cached
    assert plan_stitch(20, [(4, 8), (9, 14)], cached=19) is None  # all covered exactly


def test_the_last_prompt_token_is_always_computed():
    plan = plan_stitch(14, [(4, 8), (9, 14)], cached=0)
    assert plan is not None
    assert plan.runs[0].end == 13
    assert plan.computed_positions() == [13]


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        ([(3, 2)], "non-empty, ascending"),
        ([(0, 5), (4, 8)], "disjoint"),
        ([(5, 30)], "within the prompt"),
        ([(1,)], "pair"),
        ([(1.0, 3)], "ints"),
    ],
)
def test_bad_spans_are_named(spans, message):
    with pytest.raises(ValueError, match=message):
        check_spans(spans, 20)


def test_the_marker_after_a_cached_first_chunk_is_computed_with_the_stitched_tokens():
    # the exact match covers chunk [4, 8): the marker at 8 is computed in the stitched pass, not
    # prefilled exactly (a whole row tile for one token) and cached
    plan = plan_stitch(20, [(4, 8), (9, 14), (15, 18)], cached=8)
    assert plan is not None
    assert plan.exact_end == 8
    assert plan.runs[0].start == 9
    assert plan.computed_positions() == [8, 14, 18, 19]
    # a first chunk not cached whole is still prefilled exactly, with its marker, so it can be cached
    assert plan_stitch(20, [(4, 8), (9, 14), (15, 18)], cached=6).exact_end == 9
