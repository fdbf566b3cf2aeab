"""Device time for N agents on M devices (oresearcher.cooperation.scheduler) and the
hosted program that carries it out in the simulator (oresearcher.programs.cooperative_hosted)."""
from __future__ import annotations

import copy
import math
import statistics
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher.cooperation import scheduler as S
from oresearcher.programs.cooperative_hosted import device_time_vs_shares
from oresearcher.scenario import load_scenario
from oresearcher.hardware import builtin_profiles
from oresearcher.sim.swap import swap_seconds

REPO = Path(__file__).resolve().parents[2]


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
    from oresearcher.sim.simulate import simulate

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
    from oresearcher.sim.simulate import simulate

    sc = load_scenario(REPO / "scenarios" / "alloc-8on4.yaml", [setting, "training.steps=20"])
    with pytest.raises(UserError, match=setting.split("=")[0]):
        simulate(sc)


class _Flat:
    def __init__(self, t):
        self.t = t

    def flat_params(self):
        return self.t


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 3), numel=st.integers(1, 9), dtype=st.sampled_from(["float32", "bfloat16", "float16", "float64"]),
       ranks=st.integers(1, 4), data=st.data())
def test_round_payload_carries_weights_and_stats_bit_for_bit(k, numel, dtype, ranks, data):
    """The round's one all-gather carries each rank's weights and its float64 stats
    reinterpreted as the weights' dtype: unpacked, both come back exactly (NaN and
    infinities included), in agent order; the meta (shape-mode) payload has the same size."""
    from oresearcher.programs.cooperative_hosted import pack_round, unpack_round

    dt = getattr(torch, dtype)
    floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
    parts, weights, stats = [], [], []
    for _ in range(ranks):
        w = [torch.randn(numel).to(dt) for _ in range(k)]
        s = torch.tensor(data.draw(st.lists(floats, min_size=3 * k, max_size=3 * k)), dtype=torch.float64).reshape(k, 3)
        parts.append(pack_round([_Flat(x) for x in w], s))
        weights += w
        stats.append(s)
        meta = pack_round([_Flat(torch.empty(numel, dtype=dt, device="meta"))] * k, s)
        assert meta.shape == parts[-1].shape and meta.dtype == parts[-1].dtype
    every, rows = unpack_round(parts, k)
    assert every.shape == (ranks * k, numel)
    for a, w in enumerate(weights):
        assert torch.equal(every[a], w)
    want = torch.cat(stats)
    assert torch.equal(rows.view(torch.int64), want.view(torch.int64))  # bit patterns, NaNs too


def test_slice_clock_on_a_cpu_rank_counts_cpu_time_not_waiting():
    """A CPU rank's device time is the CPU time of the slice's steps: a step that sleeps
    (the core free for others) adds wall time, not device time."""
    import time

    from oresearcher.programs import AgentContext
    from oresearcher.programs.cooperative_hosted import SliceClock

    sc = load_scenario(REPO / "scenarios" / "alloc-8on4.yaml")
    clock = SliceClock(AgentContext(0, 4, sc, mode="real"))
    clock.start()
    t = time.thread_time()
    while time.thread_time() - t < 0.03:  # 30 ms of CPU
        pass
    clock.lap()
    time.sleep(0.1)
    clock.lap()
    (busy, idle), wall = clock.stop()
    assert busy >= 0.03 and idle < 0.02 and wall >= 0.13, (busy, idle, wall)


def test_sim_round_synchronises_once():
    """One all-gather a round (weights and stats together): the simulator's only collective."""
    report = _sim(None)
    names = {b["name"]: b for b in report["breakdown"]}
    assert set(names) == {"round_gather"} and names["round_gather"]["count"] == 4 * 10


def test_a_profile_without_a_host_link_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    prof = tmp_path / "p.yaml"  # a device profile as an older calibrate wrote it: no host_link_GBps
    prof.write_text("kind: device\nname: no-link\npeak_flops: {fp32: 1.0e9, bf16: 1.0e9, fp16: 1.0e9}\n"
                    "efficiency: 1.0\nmemory_bytes: 1.0e9\nhost_overhead_us: 1.0\nstreams: false\n")
    cmd = [sys.executable, "-m", "oresearcher.sim", str(REPO / "scenarios" / "alloc-8on4.yaml"),
           "--set", f"cluster.profile_files=[{prof}]", "--set", "cluster.device=no-link", "--out", str(tmp_path / "o")]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "'no-link' has no host_link_GBps" in p.stderr and len(p.stderr.strip().splitlines()) == 1


# --- metered device time (Scheduler.settle): the plan in seconds once measured ---------

def _metered_run(sch, rounds, units, costs, per_unit, factor, rewards=None):
    """Drive ``sch`` for ``rounds`` rounds with a fake meter: a step of agent a costs
    ``cost * per_unit[a]`` seconds in the first (unmetered) round and the plan's own
    estimate after, each times ``factor(a)``. Yields (plan, seconds, targets in seconds)."""
    n = sch.n_agents
    for r in range(rounds):
        plan = sch.plan(rewards[r] if rewards else [0.0] * n, units, costs)
        secs = []
        for a in range(n):
            step = plan.step_s[a] if plan.metered else costs[a] * per_unit[a]
            secs.append(sum(step * factor(a) for _ in range(plan.steps[a])))
        tgt = sch.settle(secs, [s * c for s, c in zip(plan.steps, costs)])
        yield plan, secs, tgt


@settings(max_examples=150, deadline=None)
@given(n_dev=st.integers(1, 4), k=st.integers(1, 3), data=st.data())
def test_metered_used_seconds_track_targets(n_dev, k, data):
    """A fake meter whose steps cost the plan's estimate times a random factor in
    [0.7, 1.3] (each step its own: shared cores do that to CPU time). After every round,
    for every agent: given - used == credit + dropped exactly; the credit stays within the
    clamp (that round's target + one step); and metered rounds drop nothing, so the
    seconds used over the metered rounds trail the seconds handed out by at most one
    round's target plus one step. Targets buy at least a step (floor >= 0.5 and
    units_per_device >= 3 k x the largest cost); each round's targets sum to the round's
    seconds, M x units_per_device x the median estimate."""
    n = n_dev * k
    costs = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    units = data.draw(st.integers(3 * k * max(costs), 60))
    per_unit = data.draw(st.lists(st.floats(0.5e-3, 2e-3), min_size=n, max_size=n))
    rounds = data.draw(st.integers(2, 12))
    rewards = data.draw(st.lists(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n),
                                 min_size=rounds, max_size=rounds))
    sch = S.Scheduler(n, n_dev, temperature=data.draw(st.floats(0.01, 5.0)), floor=data.draw(st.floats(0.5, 1.0)))
    factor = lambda a: data.draw(st.floats(0.7, 1.3))  # noqa: E731
    first_dropped = given0 = used0 = None
    for plan, secs, tgt in _metered_run(sch, rounds, units, costs, per_unit, factor, rewards):
        step = plan.step_s if plan.metered else [c * e for c, e in zip(costs, sch.unit_s)]
        if plan.metered:
            med = statistics.median(s / c for s, c in zip(plan.step_s, costs))
            assert math.isclose(sum(tgt), n_dev * units * med, rel_tol=1e-9)
        for a in range(n):
            assert sch.given[a] - sch.used[a] == pytest.approx(sch.credit[a] + sch.dropped[a], abs=1e-12)
            assert abs(sch.credit[a]) <= tgt[a] + step[a] + 1e-12
        if first_dropped is None:  # the round planned in units: its deviation is dropped by design
            first_dropped, given0, used0, carried = (list(sch.dropped), list(sch.given), list(sch.used),
                                                     list(sch.credit))
            med = statistics.median(sch.unit_s)  # its rounding remainder: under a step at the median rate
            assert all(0 <= c < k * med + 1e-12 for c, k in zip(carried, costs))
    assert sch.dropped == pytest.approx(first_dropped, abs=1e-12)
    for a in range(n):  # metered rounds: seconds handed out - seconds used = what the credit moved
        lag = (sch.given[a] - given0[a]) - (sch.used[a] - used0[a])
        assert lag == pytest.approx(sch.credit[a] - carried[a], abs=1e-12)
        assert abs(lag) <= tgt[a] + step[a] + carried[a] + 1e-12


def test_metered_rounds_by_hand():
    """Two agents on one device, equal shares, 10 units a round (binary-exact seconds).
    Round 1 (units): 5 steps each; measured 0.625 s and 1.25 s (0.125 and 0.25 s a unit).
    Median 0.1875 s a unit: round 1 handed out 5 x 0.1875 = 0.9375 s each; its deviation
    (+0.3125, -0.3125) is dropped, its remainder (0) carried.
    Round 2: 10 x 0.1875 = 1.875 s, 0.9375 each: 0.9375 / 0.125 = 7.5 -> 7 steps,
    0.9375 / 0.25 = 3.75 -> 3 steps. Agent 1's steps cost 0.3125 s (25% over): used
    0.875 and 0.9375, credit 0.0625 and 0.
    Round 3: median (0.125 + 0.3125) / 2 = 0.21875, 1.09375 s each: (1.09375 + 0.0625)
    / 0.125 = 9.25 -> 9 steps, 1.09375 / 0.3125 = 3.5 -> 3. A burst: agent 1's 3 steps
    take 3 s: credit 1.09375 - 3 = -1.90625, clamped to -(1.09375 + 0.3125) = -1.40625,
    0.5 s forgiven.
    Round 4: its own estimate is now 1 s a unit, the median 0.5625, 5.625 s, 2.8125 each:
    agent 1 has 2.8125 - 1.40625 = 1.40625 s, a step costs 1 s: 1 step."""
    sch = S.Scheduler(2, 1, enabled=False)
    p1 = sch.plan([0.0, 0.0], 10, [1, 1])
    assert p1.steps == [5, 5] and not p1.metered
    assert sch.settle([0.625, 1.25], [5, 5]) == [0.9375, 0.9375]
    assert sch.credit == [0.0, 0.0] and sch.dropped == [0.3125, -0.3125]
    assert sch.given == [0.9375, 0.9375] and sch.used == [0.625, 1.25]
    p2 = sch.plan([0.0, 0.0], 10, [1, 1])
    assert p2.metered and p2.target == [0.9375, 0.9375] and p2.step_s == [0.125, 0.25] and p2.steps == [7, 3]
    assert p2.device_units == [10.0]
    assert sch.settle([7 * 0.125, 3 * 0.3125], [7, 3]) == [0.9375, 0.9375]
    assert sch.credit == [0.0625, 0.0] and sch.used == [1.5, 2.1875] and sch.given == [1.875, 1.875]
    assert sch.unit_s == [0.125, 0.3125]
    p3 = sch.plan([0.0, 0.0], 10, [1, 1])
    assert p3.target == [1.09375, 1.09375] and p3.steps == [9, 3]
    sch.settle([9 * 0.125, 3.0], [9, 3])
    assert sch.credit == [0.0625 + 1.09375 - 1.125, -1.40625] and sch.dropped == [0.3125, -0.8125]
    p4 = sch.plan([0.0, 0.0], 10, [1, 1])
    assert p4.target == [2.8125, 2.8125] and p4.step_s[1] == 1.0 and p4.steps[1] == 1
    for a in range(2):
        assert sch.given[a] - sch.used[a] == sch.credit[a] + sch.dropped[a]


def test_metering_corrects_a_step_plan_error():
    """Equal shares, 4 agents on 2 devices; agent 1's steps cost 30% more than the
    others' (1.3 ms against 1 ms). In units it would run as many steps, 30% more device
    time; metered, it gets fewer steps from round 2 on and its seconds track its share."""
    sch = S.Scheduler(4, 2, enabled=False)
    per_step = [1e-3, 1.3e-3, 1e-3, 1e-3]
    run = list(_metered_run(sch, 20, 10, [1] * 4, per_step, lambda a: per_step[a] / (
        sch.unit_s[a] if sch.unit_s else per_step[a])))
    assert run[0][0].steps == [5, 5, 5, 5]  # round 1: units, as before
    assert run[1][0].steps == [5, 3, 5, 5]  # 5 ms / 1.3 ms = 3.8 -> 3
    assert all(p.steps[1] < p.steps[0] for p, _, _ in run[1:])
    metered_units = [sum(p.steps[a] for p, _, _ in run[1:]) for a in range(4)]
    assert metered_units[1] / metered_units[0] == pytest.approx(1 / 1.3, abs=0.02)
    used = [sum(s[a] for _, s, _ in run[1:]) for a in range(4)]
    given_s = [sum(t[a] for _, _, t in run[1:]) for a in range(4)]
    for a in range(4):  # within one step of the round's carried remainder and the last credit
        assert abs(used[a] - given_s[a]) <= 2 * per_step[a] + 1e-12, (a, used, given_s)
    assert sch.dropped[1] == pytest.approx(-5 * 0.3e-3)  # round 1's overrun: not the schedule's to repay


def test_metered_state_round_trips_and_refuses_an_unsettled_round():
    sch = S.Scheduler(4, 2, temperature=0.05)
    for rewards, secs in (([0.1] * 4, [0.01, 0.012, 0.011, 0.009]), ([0.2, 0.1, 0.3, 0.1], [0.02, 0.01, 0.03, 0.01])):
        plan = sch.plan(rewards, 10, [1] * 4)
        sch.settle(secs, [s for s in plan.steps])
    twin = S.Scheduler(4, 2)
    twin.load_state_dict(copy.deepcopy(sch.state_dict()))
    a, b = sch.plan([0.3, 0.2, 0.1, 0.1], 10, [1] * 4), twin.plan([0.3, 0.2, 0.1, 0.1], 10, [1] * 4)
    assert a == b and a.metered
    with pytest.raises(RuntimeError, match="settle"):
        sch.plan([0.3] * 4, 10, [1] * 4)
    with pytest.raises(ValueError):
        sch.settle([0.01] * 3, [1] * 3)


def test_sim_reports_the_metered_books():
    """Numeric mode meters: targets are reported in seconds from the first round on, and
    each agent's seconds handed out minus its seconds used over the run equal its credit
    plus what was dropped, from the report alone (as a gloo run's can be checked)."""
    report = _sim(None)
    rows = report["metrics"]
    first = rows["0"]
    assert all(m["target_in_seconds"] == 1.0 for m in first)
    for per_rank in rows.values():
        for a in {int(key.split(".")[1]) for key in per_rank[0] if key.startswith("device_s.")}:
            given_s = sum(m[f"target.{a}"] for m in first)
            used = sum(m[f"device_s.{a}"] for m in per_rank)
            books = per_rank[-1][f"credit.{a}"] + per_rank[-1][f"dropped.{a}"]
            assert given_s - used == pytest.approx(books, rel=1e-9, abs=1e-12), a
            assert abs(per_rank[-1][f"dropped.{a}"]) < 1e-9  # simulated steps cost what they were planned to


def test_sim_shape_mode_plans_in_units():
    """Shape mode: no values travel, nothing is measured, the plan stays in units (as
    before metering): every round hands out M x k x interval units, equal shares."""
    from oresearcher.sim.simulate import simulate

    sets = ["simulation.mode=shape", "workload.task=synthetic-lm", "workload.model=gpt-tiny", "workload.seq_len=64"]
    sc = load_scenario(REPO / "scenarios" / "alloc-8on4.yaml", sets)
    report, _ = simulate(sc)
    for m in report["metrics"]["0"]:
        assert m["target_in_seconds"] == 0.0
        assert sum(m[f"target.{a}"] for a in range(8)) == pytest.approx(4 * 2 * 20)
        assert [m[f"units.{a}"] for a in range(8)] == [20.0] * 8


def _metered_slice(budget: float, estimate: float, planned: int, cost_of):
    """A slice run as the hosted program runs it: steps while keep_stepping says so;
    ``cost_of(i)`` is step i's device seconds. Returns (steps, seconds)."""
    spent, ran = 0.0, 0
    while S.keep_stepping(spent, ran, budget, estimate, S.slice_cap(planned)):
        spent += cost_of(ran)
        ran += 1
    return ran, spent


def test_metered_slice_by_hand():
    # budget 1.0 s, plan's estimate 0.125 s: steps cost 0.25 s each (twice the estimate).
    # Before step 1: 0 + 0.125 fits. After it (0.25 s, mean 0.25): 0.5 fits, 0.75 fits,
    # 1.0 fits (exactly), then 1.25 does not: 4 steps, 1.0 s, nothing carried.
    assert _metered_slice(1.0, 0.125, 8, lambda i: 0.25) == (4, 1.0)
    # steps of 0.375 s: 0.375, 0.75; then 0.75 + 0.375 > 1: 2 steps, 0.25 s left for the credit
    assert _metered_slice(1.0, 0.125, 8, lambda i: 0.375) == (2, 0.75)
    # a budget under the estimate runs nothing (the credit carries it to the next round)
    assert _metered_slice(0.1, 0.125, 8, lambda i: 0.125) == (0, 0.0)
    # a clock that does not advance stops at the cap: four times the planned steps plus four
    assert _metered_slice(1.0, 0.125, 8, lambda i: 0.0) == (36, 0.0)
    # steps a quarter of the estimate spend the whole budget within the cap: 32 of 36
    assert _metered_slice(1.0, 0.125, 8, lambda i: 0.03125) == (32, 1.0)


@settings(max_examples=150, deadline=None)
@given(n_dev=st.integers(1, 3), k=st.integers(1, 3), data=st.data())
def test_metered_slices_keep_every_agent_within_a_step(n_dev, k, data):
    """Step costs that change every step (0.5-1.5 x the agent's base: who runs beside a
    slice changes its CPU time) and between rounds: with metered slices, after every
    metered round each agent's seconds used over the metered rounds trail the seconds
    handed out by less than its largest step, and nothing is dropped. (A step here costs at
    least a third of the last round's mean: inside the slice cap's quarter. With a cap of
    twice the plan, a slice whose steps turned 3x cheaper stopped early and carried more
    than a step.)"""
    n = n_dev * k
    base = data.draw(st.lists(st.floats(0.5e-3, 2e-3), min_size=n, max_size=n))
    units = data.draw(st.integers(3 * k, 40))
    rounds = data.draw(st.integers(3, 10))
    sch = S.Scheduler(n, n_dev, temperature=data.draw(st.floats(0.01, 5.0)), floor=data.draw(st.floats(0.5, 1.0)))
    costs = [1] * n
    biggest = [1.5 * b for b in base]
    given0 = used0 = carried = None
    for r in range(rounds):
        plan = sch.plan(data.draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)), units, costs)
        seconds, ran = [], []
        for a in range(n):
            draw = lambda i, a=a: base[a] * data.draw(st.floats(0.5, 1.5))  # noqa: E731
            if plan.metered:
                steps, spent = _metered_slice(plan.budget_s[a], plan.step_s[a], plan.steps[a], draw)
            else:
                steps = plan.steps[a]
                spent = sum(draw(i) for i in range(steps))
            seconds.append(spent)
            ran.append(steps)
        sch.settle(seconds, ran)
        if given0 is None:  # round 1, planned in units: the metered books start after it
            given0, used0, carried, dropped0 = list(sch.given), list(sch.used), list(sch.credit), list(sch.dropped)
            continue
        for a in range(n):
            lag = (sch.given[a] - given0[a]) - (sch.used[a] - used0[a])
            assert lag == pytest.approx(sch.credit[a] - carried[a], abs=1e-12)
            assert -biggest[a] - 1e-12 <= sch.credit[a] <= biggest[a] + 1e-12
    assert sch.dropped == pytest.approx(dropped0, abs=1e-12)
