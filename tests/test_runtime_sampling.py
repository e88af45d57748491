"""The sampler and SamplingParams validation."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime.sampling import Sampler, SamplingParams


def test_greedy_takes_the_first_maximum():
    logits = np.array([[0.1, 3.0, 3.0, -1.0], [5.0, 0.0, 1.0, 2.0]], dtype=np.float32)
    params = [SamplingParams(temperature=0.0)] * 2
    gens = [np.random.default_rng(0)] * 2
    assert Sampler().sample(logits, params, gens).tolist() == [1, 0]


def test_filters_shape_the_distribution_by_hand():
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = Sampler.probabilities(row, SamplingParams(temperature=1.0))
    np.testing.assert_allclose(probs, [0.5, 0.3, 0.15, 0.05])
    # top_p 0.7: 0.5 alone is < 0.7, so 0.3 joins; then the mass reaches 0.8 >= 0.7.
    np.testing.assert_allclose(Sampler.probabilities(row, SamplingParams(top_p=0.7)), [0.625, 0.375, 0, 0])
    np.testing.assert_allclose(Sampler.probabilities(row, SamplingParams(top_k=3)), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    # temperature 0.5 squares the probabilities (then renormalises)
    sq = np.array([0.25, 0.09, 0.0225, 0.0025])
    np.testing.assert_allclose(Sampler.probabilities(row, SamplingParams(temperature=0.5)), sq / sq.sum())


def test_draws_follow_the_distribution_and_seeds_repeat(rng):
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    logits = np.tile(row, (4000, 1))
    p = SamplingParams(temperature=1.0, top_k=3, seed=7)
    draws = Sampler().sample(logits, [p] * 4000, [p.make_generator()] * 4000)
    freq = np.bincount(draws, minlength=4) / 4000
    np.testing.assert_allclose(freq, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], atol=0.03)
    assert freq[3] == 0  # top-k removed it: never drawn
    again = Sampler().sample(logits[:50], [p] * 50, [p.make_generator()] * 50)
    assert again.tolist() == draws[:50].tolist()


def test_rows_use_their_own_params_and_generators():
    logits = np.log(np.array([[0.4, 0.6], [0.4, 0.6], [0.9, 0.1]]))
    params = [SamplingParams(seed=1), SamplingParams(temperature=0.0), SamplingParams(top_p=0.5, seed=3)]
    out = Sampler().sample(logits, params, [p.make_generator() for p in params])
    assert out[1] == 1 and out[2] == 0  # greedy row; top_p keeps only the 0.9 token
    solo = Sampler().sample(logits[:1], params[:1], [params[0].make_generator()])
    assert solo[0] == out[0]  # a seeded row draws the same whatever else is in the batch


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=2.5), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(seed="x"), "seed"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(stop_token_ids="12"), "stop_token_ids"),
        (dict(ignore_eos=1), "ignore_eos"),
    ],
)
def test_bad_params_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_params_normalise_stop_ids():
    assert SamplingParams(stop_token_ids=[3, np.int64(4)]).stop_token_ids == (3, 4)
