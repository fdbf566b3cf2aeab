"""Resource shares: constant total compute, floor respected (oresearcher.cooperation.allocation)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher.cooperation.allocation import AllocationState, integer_units, shares, steps_from_units

contribs = st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(contribs, st.floats(0.01, 10), st.floats(0, 1))
def test_shares_sum_to_one_and_respect_floor(c, temp, floor):
    s = shares(c, temp, floor)
    assert float(s.sum()) == pytest.approx(1.0, abs=1e-9)
    assert float(s.min()) >= floor / len(c) - 1e-9


@settings(max_examples=40, deadline=None)
@given(contribs, st.floats(0.01, 10))
def test_shares_follow_contributions(c, temp):
    s = shares(c, temp, 0.0)
    order = sorted(range(len(c)), key=lambda i: c[i])
    assert all(s[a] <= s[b] + 1e-12 for a, b in zip(order, order[1:]))


def test_equal_contributions_and_full_floor_give_equal_shares():
    assert shares([0.3, 0.3, 0.3], 0.1, 0.0).tolist() == pytest.approx([1 / 3] * 3)
    assert shares([5.0, -5.0, 0.0], 0.1, 1.0).tolist() == pytest.approx([1 / 3] * 3)


def test_floor_lifts_a_starved_agent():
    s = shares([10.0, 0.0, 0.0, 0.0], 0.1, 0.5)
    assert s[1:].tolist() == pytest.approx([0.125] * 3) and float(s[0]) == pytest.approx(0.625)


def test_non_finite_contribution_counts_as_the_worst():
    s = shares([0.1, math.nan, 0.2], 0.05, 0.0)
    assert float(s[1]) <= float(s[0]) <= float(s[2])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.01, 1), min_size=1, max_size=8), st.integers(0, 500), st.integers(0, 3))
def test_integer_units_add_up_exactly(f, total, minimum):
    if total < len(f) * minimum:
        with pytest.raises(ValueError):
            integer_units(torch.tensor(f), total, minimum)
        return
    u = integer_units(torch.tensor(f), total, minimum)
    assert sum(u) == total and min(u) >= minimum


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 3), st.integers(0, 2)), min_size=1, max_size=6))
def test_steps_from_units_conserve_compute(rows):
    units, costs, carry = zip(*rows)
    steps, left = steps_from_units(units, costs, carry)
    for s, c, u, k, l in zip(steps, costs, units, carry, left):
        assert s * c + l == u + k and 0 <= l < c


def test_total_compute_per_round_is_constant_over_rounds():
    """Five rounds of changing rewards and a SAM agent (2 units/step): every round spends
    the same number of units, up to what is carried (less than one step)."""
    a = AllocationState(4, temperature=0.05, floor=0.5)
    costs = [1, 2, 1, 1]
    rewards = [[0.1, 0.2, 0.3, 0.1], [0.3, 0.2, 0.3, 0.2], [0.3, 0.5, 0.3, 0.25], [0.6, 0.5, 0.31, 0.2],
               [0.6, 0.7, 0.3, 0.2]]
    spent = []
    for r in rewards:
        before = sum(a.carry)
        steps, s = a.plan(r, 100, costs)
        spent.append(sum(n * c for n, c in zip(steps, costs)) + sum(a.carry) - before)
        assert float(s.min()) >= 0.5 / 4 - 1e-9 and min(steps) >= 1
    assert spent == [100] * 5
    state = a.state_dict()
    b = AllocationState(4)
    b.load_state_dict(state)
    (sb, fb), (sa, fa) = b.plan([0.7, 0.7, 0.3, 0.2], 100, costs), a.plan([0.7, 0.7, 0.3, 0.2], 100, costs)
    assert sb == sa and torch.equal(fb, fa)


def test_disabled_allocation_gives_equal_steps():
    a = AllocationState(4, enabled=False)
    a.plan([0.0] * 4, 40, [1] * 4)
    assert a.plan([0.9, 0.1, 0.1, 0.1], 40, [1] * 4)[0] == [10] * 4
