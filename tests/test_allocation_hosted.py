"""Device time for N agents on M devices (oresearcher.cooperation.scheduler) and the
hosted program that carries it out in the simulator (oresearcher.programs.cooperative_hosted)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
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
        s = torch.tensor(data.draw(st.lists(floats, min_size=2 * k, max_size=2 * k)), dtype=torch.float64).reshape(k, 2)
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
