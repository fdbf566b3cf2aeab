"""Device time for N agents on M devices (oresearcher.cooperation.scheduler) and the
hosted program that carries it out in the simulator (oresearcher.programs.cooperative_hosted)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher.cooperation import scheduler as S
from oresearcher.programs.cooperative_hosted import device_time_vs_shares
from oresearcher.scenario import load_scenario
from sim.hardware import builtin_profiles
from sim.swap import swap_seconds

REPO = Path(__file__).resolve().parents[1]


def test_placement_blocks_and_refusals():
    assert S.placement(8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert S.hosted(2, 8, 4) == [4, 5]
    for n, m in ((3, 4), (7, 4), (8, 0)):
        with pytest.raises(ValueError):
            S.placement(n, m)


def test_whole_steps_by_hand():
    # targets 10.5 and 3 units, a SAM step costs 2: 5 steps (0.5 left), 1 step (1 left)
    steps, credit = S.whole_steps([10.5, 3.0], [2, 2], [0.0, 0.0])
    assert steps == [5, 1] and credit == [0.5, 1.0]
    steps, credit = S.whole_steps([10.5, 3.0], [2, 2], credit)  # the credit buys a step next round
    assert steps == [5, 2] and credit == [1.0, 0.0]


def _device(name):
    return builtin_profiles()[("device", name)]


def test_switch_priced_at_the_host_link():
    # 1.2 GB of state out and in again over cpu-local's 3 GB/s copy: 0.8 s
    assert S.switch_seconds(1.2e9, 3e9) == pytest.approx(0.8)
    assert swap_seconds(_device("cpu-local"), 3e9) == pytest.approx(1.0)
    assert swap_seconds(_device("A100-SXM4-80GB"), 25e9) == pytest.approx(1.0)


@settings(max_examples=100, deadline=None)
@given(n_dev=st.integers(1, 6), k=st.integers(1, 4), data=st.data())
def test_plan_bounds(n_dev, k, data):
    """Floor respected; the round's targets sum to its device time; steps never run
    ahead of the targets and trail them by less than one step over the run."""
    n = n_dev * k
    floor = data.draw(st.floats(0.0, 1.0))
    units = data.draw(st.integers(1, 50))
    costs = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    sch = S.Scheduler(n, n_dev, temperature=data.draw(st.floats(0.01, 5.0)), floor=floor)
    for _ in range(data.draw(st.integers(1, 6))):
        rewards = data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
        plan = sch.plan(rewards, units, costs)
        assert math.isclose(sum(plan.target), n_dev * units, rel_tol=1e-9)
        assert math.isclose(sum(plan.shares), 1.0, rel_tol=1e-9)
        assert all(s >= floor / n - 1e-12 for s in plan.shares)
        assert sum(plan.device_units) == sum(s * c for s, c in zip(plan.steps, costs))
    for a in range(n):
        assert sch.used[a] <= sch.given[a] + 1e-9
        assert sch.given[a] - sch.used[a] < costs[a] + 1e-9


def test_exploited_agent_starts_fresh():
    sch = S.Scheduler(4, 2, temperature=0.05, floor=0.0)
    sch.plan([0.1, 0.1, 0.1, 0.1], 10, [1] * 4)
    sch.fresh(3)  # agent 3 just took the best agent's weights: its jump is not its own
    plan = sch.plan([0.1, 0.1, 0.1, 0.9], 10, [1] * 4)
    assert plan.shares == pytest.approx([0.25] * 4)


def _sim(tmp_path, **alloc):
    from sim.simulate import simulate

    sets = [f"cooperation.allocation.{k}={v}" for k, v in alloc.items()]
    sc = load_scenario(REPO / "scenarios" / "alloc-8on4.yaml", sets)
    report, _ = simulate(sc)
    return report


def test_sim_device_time_matches_shares(tmp_path):
    report = _sim(tmp_path)
    used, given, capped = device_time_vs_shares(report, skip_rounds=0)  # simulated: no warm-up
    assert capped == 0
    assert max(given) > 1.5 * min(given)  # the shares really moved time between agents
    for a in range(8):
        assert abs(used[a] - given[a]) <= 0.05 * given[a], (a, used, given)


@pytest.mark.parametrize("setting", ["cooperation.replay.enabled=true", "communication.gradient_sharing=true"])
def test_settings_it_does_not_run_are_refused(setting):
    from oresearcher.errors import UserError
    from sim.simulate import simulate

    sc = load_scenario(REPO / "scenarios" / "alloc-8on4.yaml", [setting, "training.steps=20"])
    with pytest.raises(UserError, match=setting.split("=")[0]):
        simulate(sc)
