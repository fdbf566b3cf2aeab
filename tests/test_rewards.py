"""Reward terms and the reward-weight schedule (oresearcher.rewards)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher.rewards import (SAFETY_RULES, centre_band_safety, count_novelty, finite_safety, overconfident_error_safety,
                                 ramp, register_safety_rule, reward, scheduled_weights, tv_novelty)

weights = st.tuples(*(st.floats(0, 1, allow_nan=False) for _ in range(3))).filter(lambda w: sum(w) > 1e-3)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_schedule_endpoints(schedule):
    w = (0.5, 0.3, 0.2)
    b0, n0, s0 = scheduled_weights(w, 0.0, schedule, 0.5)
    b1, n1, s1 = scheduled_weights(w, 1.0, schedule, 0.5)
    assert n0 == pytest.approx(0.45) and n1 == pytest.approx(0.15)  # 0.3 * (1 +- 0.5)
    # what novelty gives up goes to base and safety in proportion 0.5 : 0.2
    assert b1 == pytest.approx(0.5 + 0.15 * 5 / 7) and s1 == pytest.approx(0.2 + 0.15 * 2 / 7)
    assert b0 == pytest.approx(0.5 - 0.15 * 5 / 7) and s0 == pytest.approx(0.2 - 0.15 * 2 / 7)
    mid = scheduled_weights(w, 0.5, schedule, 0.5)
    assert mid == pytest.approx(w)  # both ramps pass through 1/2 at mid-training


def test_constant_schedule_and_zero_boost_leave_weights_alone():
    assert scheduled_weights((0.5, 0.3, 0.2), 0.1, "constant", 0.9) == pytest.approx((0.5, 0.3, 0.2))
    assert scheduled_weights((0.5, 0.3, 0.2), 0.9, "cosine", 0.0) == pytest.approx((0.5, 0.3, 0.2))


def test_cosine_is_slower_than_linear_early():
    assert ramp(0.1, "cosine") < ramp(0.1, "linear")
    assert ramp(0.9, "cosine") > ramp(0.9, "linear")
    with pytest.raises(ValueError):
        ramp(0.5, "exponential")


@settings(max_examples=60, deadline=None)
@given(weights, st.floats(0, 1), st.floats(0, 1), st.sampled_from(["linear", "cosine", "constant"]))
def test_schedule_keeps_sum_and_signs(w, p, b, schedule):
    out = scheduled_weights(w, p, schedule, b)
    assert sum(out) == pytest.approx(sum(w), abs=1e-9)
    assert all(x >= -1e-12 for x in out)


@settings(max_examples=40, deadline=None)
@given(weights, st.floats(0, 1), st.floats(0, 1), st.sampled_from(["linear", "cosine"]))
def test_novelty_weight_never_rises_over_training(w, p, q, schedule):
    lo, hi = sorted((p, q))
    assert scheduled_weights(w, hi, schedule)[1] <= scheduled_weights(w, lo, schedule)[1] + 1e-12


def test_reward_is_the_weighted_sum():
    t, n, s = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    assert reward(t, n, s, (0.5, 0.3, 0.2)).tolist() == pytest.approx([0.6, 0.4])


def test_novelty_terms():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    assert float(tv_novelty(p, p)) == 0.0
    assert float(tv_novelty(p, torch.tensor([[0.0, 1.0], [0.5, 0.5]]))) == pytest.approx(0.5)
    assert count_novelty(torch.tensor([0, 3])).tolist() == pytest.approx([1.0, 0.5])


def test_safety_rules():
    probs = torch.tensor([[0.95, 0.05], [0.6, 0.4], [0.05, 0.95], [0.99, 0.01]])
    labels = torch.tensor([1, 1, 1, 0])  # one confident error, one unsure error
    assert overconfident_error_safety(probs, labels) == pytest.approx(0.75)
    assert centre_band_safety(torch.tensor([0.0, 1.0, -2.0, 1.3])) == pytest.approx(0.5)
    assert finite_safety(torch.tensor([1.0, math.inf])) == 0.0 and finite_safety(torch.ones(2)) == 1.0
    register_safety_rule("test-always", lambda **_: 1.0)
    assert SAFETY_RULES["test-always"]() == 1.0
    with pytest.raises(ValueError):
        register_safety_rule("finite", finite_safety)
