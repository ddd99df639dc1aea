"""Sampling: greedy, temperature, top-k, top-p, repetition penalty, seeded; the native draw and the
NumPy one (where the native kernels cannot run, and for top-k / top-p) both follow the distribution."""

import pytest
import torch

import engine.sampling as sampling
from engine.sampling import SamplingParams, apply_repetition_penalty, sample


@pytest.fixture(params=["native", "numpy"])
def draw_path(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(sampling, "_native_draw", lambda: None)
    else:
        assert sampling._native_draw() is not None  # every CPU this project runs on has AVX2 and FMA
    return request.param


def test_greedy_is_argmax(draw_path):
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample(logits, SamplingParams(temperature=0.0)) == 1


def test_top_k_one_is_greedy_even_with_temperature():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample(logits, SamplingParams(temperature=1.5, top_k=1)) == 1


def test_seed_makes_sampling_reproducible(draw_path):
    logits = torch.randn(1000)
    params = SamplingParams(temperature=1.0, seed=7)
    first = [sample(logits, params, g) for g in [params.make_generator()] for _ in range(20)]
    again = [sample(logits, params, g) for g in [params.make_generator()] for _ in range(20)]
    assert first == again
    assert len(set(first)) > 1


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-30])
def test_tiny_temperature_is_near_greedy_not_nan(temperature, draw_path):
    """A temperature the API accepts (any float > 0) must not turn the logits into inf - inf = nan."""
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0, float(torch.finfo(torch.float32).min)])
    for params in (
        SamplingParams(temperature=temperature, top_p=0.9, top_k=4, seed=1),
        SamplingParams(temperature=temperature, seed=1),
    ):
        gen = params.make_generator()
        assert {sample(logits, params, gen) for _ in range(20)} == {1}


def test_top_k_restricts_support():
    logits = torch.arange(100, dtype=torch.float32)
    params = SamplingParams(temperature=5.0, top_k=3, seed=0)
    gen = params.make_generator()
    assert {sample(logits, params, gen) for _ in range(200)} <= {97, 98, 99}


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05]))
    params = SamplingParams(temperature=1.0, top_p=0.8, seed=0)
    gen = params.make_generator()
    assert {sample(logits, params, gen) for _ in range(300)} == {0, 1}


def test_repetition_penalty_pushes_seen_tokens_down():
    logits = torch.tensor([2.0, 1.9, -1.0])
    out = apply_repetition_penalty(logits, [0, 2], 2.0)
    torch.testing.assert_close(out, torch.tensor([1.0, 1.9, -2.0]))
    assert sample(logits, SamplingParams(repetition_penalty=2.0), history=[0]) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"repetition_penalty": 0.0},
        {"stop": [""]},
        {"stop": ["x"] * 17},
    ],
)
def test_invalid_params_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_single_stop_string_is_wrapped():
    assert SamplingParams(stop="END").stop == ["END"]


def test_draws_follow_the_distribution_and_never_pick_a_zero_mass_token(draw_path):
    probs = torch.tensor([0.5, 0.3, 0.0, 0.2, 0.0])
    logits = probs.clamp_min(1e-45).log()  # the zero-mass tokens at -inf after the shift
    logits[probs == 0] = float("-inf")
    params = SamplingParams(temperature=1.0, seed=3)
    gen = params.make_generator()
    draws = torch.tensor([sample(logits, params, gen) for _ in range(20000)])
    freq = torch.bincount(draws, minlength=5).double() / draws.numel()
    assert freq[2] == 0 and freq[4] == 0
    assert torch.allclose(freq, probs.double(), atol=0.015)


def test_a_row_longer_than_a_block_draws_from_every_block_in_proportion(draw_path):
    # 20 tokens (two whole eight-lane blocks and a tail of four), mass doubling every fifth token
    logits = torch.arange(20, dtype=torch.float32).div(5).mul(torch.log(torch.tensor(2.0)))
    params = SamplingParams(temperature=1.0, seed=5)
    gen = params.make_generator()
    draws = torch.tensor([sample(logits, params, gen) for _ in range(20000)])
    freq = torch.bincount(draws, minlength=20).double() / draws.numel()
    assert torch.allclose(freq, torch.softmax(logits.double(), 0), atol=0.012)


def test_the_native_draw_refuses_bad_input():
    draw = sampling._native_draw()
    assert draw is not None
    with pytest.raises(RuntimeError, match="float32 row"):
        draw(torch.zeros(4, dtype=torch.float64), 1.0, 0.5)
    with pytest.raises(RuntimeError, match="uniform draw"):
        draw(torch.zeros(4), 1.0, 1.0)
