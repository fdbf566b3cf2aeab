"""The calibration's model of a busy run: compute jitter (pooled step spread -> per-op cv)
and the in-run scaling of the fabric fit. Pure math and op bookkeeping; no process group."""
import math
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher import ops as O
from oresearcher.backends.calibration.measure import _OpLog, merge_inrun, merge_waits
from oresearcher.calibrate import (FabricFit, compute_rate, device_doc, inrun_factor, jitter_fit, op_jitter_cv,
                                   own_slowness, pooled_cv, scaled)
from oresearcher.hardware import DeviceProfile

FIT = FabricFit(call_overhead_s=20e-6, base_latency_s=100e-6, hop_latency_s=10e-6, bandwidth_Bps=1e9)


def test_pooled_cv_counts_a_persistently_slow_rank_as_spread():
    assert pooled_cv([[1.0, 1.0], [1.0, 1.0]]) == 0.0
    assert pooled_cv([[1.0, 1.0], [3.0, 3.0]]) == pytest.approx(0.5)  # std 1 around mean 2
    assert pooled_cv([[2.0, 4.0]]) == pytest.approx(1 / 3)
    assert pooled_cv([]) == 0.0


@pytest.mark.parametrize("k", [1, 4, 9])
def test_op_jitter_cv_of_equal_ops_scales_with_their_number(k):
    # k equal, independent ops: the step's cv is c / sqrt(k)
    assert op_jitter_cv(0.1, [[1e9] * k] * 3, rate=1e12, host_s=0.0) == pytest.approx(0.1 * math.sqrt(k))
    assert op_jitter_cv(0.0, [[1e9] * k], rate=1e12, host_s=0.0) == 0.0
    assert op_jitter_cv(0.1, [], rate=1e12, host_s=0.0) == 0.0


@settings(max_examples=6, deadline=None)
@given(st.lists(st.floats(1e6, 1e9), min_size=1, max_size=5), st.floats(0.02, 0.3), st.integers(0, 10**6))
def test_op_jitter_cv_reproduces_the_step_spread_in_the_engine_model(flops, step_cv, seed):
    """Draw each op's factor as the engine does; the simulated steps have the target cv."""
    from oresearcher.sim.engine import lognormal_params

    rate, host = 1e12, 5e-6
    c = op_jitter_cv(step_cv, [flops], rate, host)
    mu, sigma = lognormal_params(c)
    d = np.array([f / rate + host for f in flops])
    steps = (np.random.default_rng(seed).lognormal(mu, sigma, size=(20000, len(d))) * d).sum(axis=1)
    assert steps.std() / steps.mean() == pytest.approx(step_cv, rel=0.1)


def test_inrun_factor_and_scaled_fit():
    rows = [{"kind": "AllReduce", "bytes": b, "time_s": 1.5 * FIT.predict("AllReduce", b, 2), "count": 3}
            for b in (1e5, 1e6)]
    f = inrun_factor(rows, 2, FIT)
    assert f == pytest.approx(1.5)
    s = scaled(FIT, f)
    for b in (1e3, 1e6, 1e8):
        assert s.predict("AllGather", b, 4) == pytest.approx(1.5 * FIT.predict("AllGather", b, 4))
    assert inrun_factor([], 2, FIT) == 1.0
    # weighted by instance count: geometric mean
    rows2 = [dict(rows[0], time_s=2 * FIT.predict("AllReduce", 1e5, 2), count=1),
             dict(rows[1], time_s=0.5 * FIT.predict("AllReduce", 1e6, 2), count=1)]
    assert inrun_factor(rows2, 2, FIT) == pytest.approx(1.0)


def test_merge_inrun_takes_the_last_arrival_and_averages_instances():
    r0 = [("AllReduce", 400, 2, 0.010), ("AllGather", 800, 2, 0.002), ("AllReduce", 400, 2, 0.004)]
    r1 = [("AllReduce", 400, 2, 0.003), ("AllGather", 800, 2, 0.005), ("AllReduce", 400, 2, 0.007)]
    rows = merge_inrun([r0, r1], 2)
    by = {(r["kind"], r["bytes"]): r for r in rows}
    assert by["AllReduce", 400]["time_s"] == pytest.approx((0.003 + 0.004) / 2)
    assert by["AllReduce", 400]["count"] == 2
    assert by["AllGather", 800]["time_s"] == pytest.approx(0.002)
    assert all(r["in_run"] and r["workload"] for r in rows)
    # sequences that do not line up are not guessed at; subgroups and p2p are left out
    assert merge_inrun([r0, r1[:2]], 2) == []
    assert merge_inrun([r0, [r1[1], r1[0], r1[2]]], 2) == []
    assert merge_inrun([[("AllReduce", 400, 2, 0.1)], [("AllReduce", 400, 2, 0.1)]], 4) == []
    assert merge_inrun([[("Send", 400, 2, 0.1)], [("Recv", 400, 2, 0.1)]], 2) == []
    # fsdp's own collectives: each instance as the ranks see it on average, waits included
    mean = {(r["kind"], r["bytes"]): r["time_s"] for r in merge_inrun([r0, r1], 2, pick=statistics.fmean)}
    assert mean["AllReduce", 400] == pytest.approx((0.0065 + 0.0055) / 2)
    assert mean["AllGather", 800] == pytest.approx(0.0035)
    # shard groups of 2 in a world of 4: kept only when asked, each row with its group's size
    quad = [[("AllGather", 800, 2, 0.002)], [("AllGather", 800, 2, 0.004)], [("AllGather", 800, 2, 0.006)],
            [("AllGather", 800, 2, 0.008)]]
    assert merge_inrun(quad, 4, pick=statistics.fmean) == []
    (row,) = merge_inrun(quad, 4, pick=statistics.fmean, subgroups=True)
    assert row["ranks"] == 2 and row["time_s"] == pytest.approx(0.005)
    assert inrun_factor([row], 4, FIT) == pytest.approx(0.005 / FIT.predict("AllGather", 800, 2))


def test_oplog_notes_compute_flops_and_collective_sizes_per_step():
    def prog():
        yield O.Compute(flops=5.0)
        yield O.AllGather(torch.ones(10))  # 40 bytes each, S = 80 gathered on 2 ranks
        yield O.StepDone(0)
        yield O.Compute(flops=7.0)
        yield O.Compute(flops=1.0)
        got = yield O.AllReduce(torch.ones(3))
        assert got == "result"  # what the interpreter sends goes through the wrapper
        yield O.StepDone(1)

    log = _OpLog(2)
    gen = log.wrap(prog())
    op = next(gen)
    while True:
        try:
            op = gen.send("result" if isinstance(op, O.AllReduce) else None)
        except StopIteration:
            break
    assert log.flops[:2] == [[5.0], [7.0, 1.0]]
    assert log.comms == [("AllGather", 80, 2, 0), ("AllReduce", 12, 2, 1)]
    assert log.segments == [[(0, 5.0)], [(1, 7.0), (1, 1.0)]]  # what each rank ran since the previous meeting


def measured(**kw):
    m = {"backend": "gloo", "world_size": 2, "flops_per_step": 1e9, "compute_step_s": 0.12,
         "compute_step_s_mean": 0.10, "compute_ops_per_step": 2, "host_overhead_s": 0.0,
         "step_seconds_per_rank": [[0.09, 0.11], [0.09, 0.11]], "op_flops": [[1e9, 0.0]]}
    return {**m, **kw}


def test_jitter_takes_the_mean_rank_rate_and_writes_a_loadable_cv():
    m = measured(step_seconds_per_rank=[[0.09, 0.11], [0.11, 0.09]])
    assert compute_rate(m) == pytest.approx(1e9 / 0.12)  # steady ranks: the slowest sets the pace
    assert compute_rate(m, jitter=True) == pytest.approx(1e10)  # jitter: the pace emerges
    # one dominant op: the step's own cv, 0.01 * sqrt(2) / 0.1 (two ranks, opposite swings)
    assert jitter_fit(m)[0] == pytest.approx(0.1 * math.sqrt(2))
    doc = device_doc("cpu-cal", m, 8e9, jitter=True)
    dev = DeviceProfile.model_validate(doc)
    assert dev.compute_jitter_cv == pytest.approx(0.1 * math.sqrt(2))
    # ranks that slow down together wait for no one: no jitter to simulate
    assert jitter_fit(measured(step_seconds_per_rank=[[0.09, 0.11], [0.09, 0.11]]))[0] == 0.0
    assert "compute_jitter_cv" not in device_doc("cpu-cal", m, 8e9)  # off: the field is left out


@pytest.mark.parametrize("strategy,local_steps,expected", [("ddp", 10, 30), ("local_sgd", 10, 300), ("diloco", 2, 60),
                                                           ("diloco", 50, 300), ("oresearcher", 50, 30)])
def test_default_compute_steps_cover_thirty_averaging_rounds(strategy, local_steps, expected):
    from oresearcher.calibrate import default_compute_steps
    from oresearcher.scenario import load_scenario

    from pathlib import Path

    s = load_scenario(Path(__file__).parents[2] / "scenarios/local-gloo.yaml", [f"training.strategy={strategy}", f"training.local_steps={local_steps}"])
    assert default_compute_steps(s) == expected


def ar1_series(rho, n, seed, mean=0.03, cv=0.05):
    rng = np.random.default_rng(seed)
    z = np.empty(n)
    z[0] = rng.standard_normal()
    for t in range(1, n):
        z[t] = rho * z[t - 1] + math.sqrt(1 - rho * rho) * rng.standard_normal()
    return list(mean * (1 + cv * z))


def test_variance_ratio_golden_numbers():
    from oresearcher.calibrate import variance_ratio

    assert variance_ratio(0.0, 10) == 1.0
    assert variance_ratio(0.5, 2) == pytest.approx(1.5)  # 1 + 2 (1/2) 0.5
    assert variance_ratio(0.5, 3) == pytest.approx(1 + 2 * (2 / 3 * 0.5 + 1 / 3 * 0.25))  # 11/6
    assert variance_ratio(0.99, 10) < 10  # at most k (fully persistent steps)


@settings(max_examples=6, deadline=None)
@given(rho=st.sampled_from([0.0, 0.3, 0.6, 0.85]), seed=st.integers(0, 10**6))
def test_persistence_rho_recovers_an_ar1(rho, seed):
    from oresearcher.calibrate import persistence_rho

    # 2 ranks x 3000 steps, period 10: the estimate's spread is a few hundredths
    got = persistence_rho([ar1_series(rho, 3000, seed), ar1_series(rho, 3000, seed + 1)], 10)
    assert got == pytest.approx(rho, abs=0.1)


def test_persistence_rho_edges():
    from oresearcher.calibrate import persistence_rho

    steady = [[0.03] * 100, [0.03] * 100]
    assert persistence_rho(steady, 10) == 0.0  # no spread
    assert persistence_rho([ar1_series(0.8, 100, 0)], 1) == 0.0  # averaging every step: nothing to fit
    assert persistence_rho([ar1_series(0.8, 20, 0)], 10) == 0.0  # fewer than 3 periods of steps
    # a rank slower for the whole run is persistence at its strongest
    assert persistence_rho([[0.03] * 100, [0.033] * 100], 10) == pytest.approx(0.99)


def test_persistent_jitter_writes_the_step_spread_and_rho():
    m = measured(step_seconds_per_rank=[ar1_series(0.7, 300, 1, mean=0.1, cv=0.1),
                                        ar1_series(0.7, 300, 2, mean=0.1, cv=0.1)],
                 op_flops=[[0.5e9, 0.5e9]], sync_period=10)
    doc = device_doc("cpu-cal", m, 8e9, jitter=True)
    dev = DeviceProfile.model_validate(doc)
    assert 0.4 < dev.compute_jitter_rho < 0.95
    # one factor per step: the cv is the step's own spread, not the per-op conversion
    assert dev.compute_jitter_cv == pytest.approx(pooled_cv(own_slowness(m["step_seconds_per_rank"])))
    assert "compute_jitter_rho" not in device_doc("cpu-cal", dict(m, sync_period=1), 8e9, jitter=True)
    assert "compute_jitter_rho" not in device_doc("cpu-cal", m, 8e9)  # jitter off


@pytest.mark.parametrize("overrides,expected", [
    (["training.strategy=ddp"], 1), (["training.strategy=local_sgd", "training.local_steps=7"], 7),
    (["training.strategy=diloco", "training.local_steps=20"], 20),
    (["training.strategy=oresearcher", "communication.share_every=4"], 4),
    (["training.strategy=oresearcher", "communication.gradient_sharing=false", "communication.interval=25"], 25)])
def test_sync_period_of_each_strategy(overrides, expected):
    from pathlib import Path

    from oresearcher.calibrate import sync_period
    from oresearcher.scenario import load_scenario

    assert sync_period(load_scenario(Path(__file__).parents[2] / "scenarios/local-gloo.yaml", overrides)) == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(1e-4, 1.0), min_size=0, max_size=60), min_size=1, max_size=3),
       st.integers(1, 12))
def test_persistence_rho_stays_in_its_range(series, period):
    from oresearcher.calibrate import persistence_rho

    assert 0.0 <= persistence_rho(series, period) <= 0.99


def test_own_slowness_drops_what_ranks_share_and_keeps_what_they_do_not():
    rng = np.random.default_rng(0)
    common = 0.1 * (1 + 0.2 * rng.standard_normal(4000))  # the whole host slows down
    own = [0.1 * 0.05 * rng.standard_normal(4000) for _ in range(3)]  # each rank's own 5 %
    ranks = [common + o for o in own]
    assert pooled_cv(ranks) == pytest.approx(0.2, rel=0.1)  # mostly the shared part
    assert pooled_cv(own_slowness(ranks)) == pytest.approx(0.05, rel=0.1)  # only the own part
    assert pooled_cv(own_slowness([common, common])) == pytest.approx(0.0, abs=1e-12)
    # a rank slower for the whole run keeps its offset: +-1 % around the grand mean, times sqrt(2)
    assert pooled_cv(own_slowness([[0.099] * 50, [0.101] * 50])) == pytest.approx(0.01 * math.sqrt(2))
    assert own_slowness([[0.1, 0.2]]) == []  # one rank: nothing to wait for


def test_merge_waits_takes_each_ranks_time_less_the_shortest():
    """Ranks leave a collective together, so the differences of their times in it are the
    differences of their arrivals: rank 0 came 3 ms early to the first, 1 ms to the second."""
    r0 = [("AllReduce", 8, 2, 0.005), ("AllGather", 16, 2, 0.002), ("AllReduce", 8, 1, 0.001)]
    r1 = [("AllReduce", 8, 2, 0.002), ("AllGather", 16, 2, 0.003), ("AllReduce", 8, 1, 0.009)]
    rows = merge_waits([r0, r1], [[(0, 1e9)], [], [(1, 5.0)]], 2)
    assert [r["kind"] for r in rows] == ["AllReduce", "AllGather"]  # a group of one is no meeting
    assert [(r["flops"], r["steps"]) for r in rows] == [([1e9], [0]), ([], [])]
    assert [r["wait_s"] for r in rows] == [pytest.approx(0.0015), pytest.approx(0.0005)]  # mean over the 2 ranks
    assert merge_waits([r0, r1[:2]], [[(0, 1e9)], [], [(1, 5.0)]], 2) == []  # logs that do not line up
    assert merge_waits([r0], [[(0, 1e9)], [], [(1, 5.0)]], 1) == []


def test_simulated_wait_of_one_op_is_the_hand_figure():
    """Two ranks, one op of d = 1 ms with cv 0.01 (a lognormal that close to normal): the
    arrivals differ by N(0, 2 (cv d)^2), whose mean absolute value is 2 cv d / sqrt(pi);
    each rank waits half of it on average: cv d / sqrt(pi) = 5.64 us."""
    from oresearcher.calibration.jitter import simulated_meetings

    def simulated_wait(*a, **kw):  # no wake-up delays: the spread is the mean wait
        return simulated_meetings(*a, **kw)[0]

    rows = [{"flops": [1e9]}]
    got = simulated_wait(rows, 1e12, 0.0, 0.01, 2, draws=200_000)
    assert got == pytest.approx(0.01 * 1e-3 / math.sqrt(math.pi), rel=0.01)
    assert simulated_wait(rows, 1e12, 0.0, 0.0, 2) == 0.0  # steady ranks wait for no one
    assert simulated_wait([{"flops": []}], 1e12, 0.0, 0.3, 2) == 0.0  # nothing between two meetings
    assert simulated_wait(rows, 1e12, 0.0, 0.3, 1) == 0.0
    # the same inputs, the same figure
    assert simulated_wait(rows * 3, 1e12, 5e-6, 0.2, 4) == simulated_wait(rows * 3, 1e12, 5e-6, 0.2, 4)


@pytest.mark.parametrize("n, rho, every, wake_us", [(2, 0.0, 0, 0.0), (4, 0.0, 0, 0.0), (2, 0.6, 5, 0.0),
                                                    (3, 0.9, 10, 0.0), (2, 0.0, 0, 2000.0), (4, 0.5, 5, 500.0)])
def test_simulated_meetings_are_what_the_engine_draws(n, rho, every, wake_us):
    """The simulator's own ranks, jittering with the same cv (and persistence rho, and
    wake-up delays), spend as long beyond the transfer in the same collectives, within
    10 %: ``every`` 0, two meetings a step, one after a 40 ms op and one after a 0.2 ms
    op; else one meeting every ``every`` steps of both ops (periodic averaging, where
    persistence matters). Without wake-up delays that time is the wait for the last
    arrival."""
    from oresearcher.reporting.report import summarize
    from oresearcher.calibration.jitter import simulated_meetings
    from oresearcher.sim.engine import Engine
    from simkit import DEVICE, topo

    def program(steps):
        for s in range(steps):
            yield O.Compute(flops=4e10)
            if not every:
                yield O.AllReduce(torch.empty(64, device="meta"))
            yield O.Compute(flops=2e8)
            if not every or s % every == every - 1:
                yield O.AllReduce(torch.empty(64, device="meta"))
            yield O.StepDone(s)

    steps = 1500
    device = DEVICE.model_copy(update={"compute_jitter_cv": 0.2, "compute_jitter_rho": rho, "wake_delay_us": wake_us})
    tl = Engine(topo(n), device, "fp32", "ring", seed=3).run([program(steps) for _ in range(n)])
    rep = summarize(tl, {}, "sim")
    def one():
        yield O.AllReduce(torch.empty(64, device="meta"))

    transfer = Engine(topo(n), DEVICE, "fp32", "ring").run([one() for _ in range(n)]).totals[0]["blocked"]
    if not every:  # the calibration's rows of the same program: what ran between two meetings, by step
        rows, meetings = [{"flops": [4e10], "steps": [0]}, {"flops": [2e8], "steps": [0]}], 2 * steps
    else:
        rows = [{"flops": [4e10, 2e8] * every, "steps": [t // 2 + k * every for t in range(2 * every)]}
                for k in range(20)]
        meetings = steps // every
    beyond = rep["exposed_comm_time_s"] * steps - transfer * meetings  # per rank, the whole run
    spread, floor = simulated_meetings(rows, 1e12, 0.0, 0.2, n, rho, wake_us * 1e-6)
    assert beyond / meetings == pytest.approx(spread + floor, rel=0.1)  # mean over ranks: (mean - min) + min
    if not wake_us:
        assert rep["peer_wait_time_s"] * steps / meetings == pytest.approx(simulated_meetings(rows, 1e12, 0.0, 0.2, n, rho)[0],
                                                                           rel=0.1)


def test_profile_fits_the_wake_up_delay_to_the_waits_the_jitter_leaves():
    from oresearcher.calibration.profiles import profile_text, wake_fit

    def line_of(wait_s):
        waits = [{"kind": "AllReduce", "flops": [1e9], "steps": [0], "wait_s": wait_s}] * 10
        m = measured(step_seconds_per_rank=[[0.09, 0.11], [0.11, 0.09]], arrival_waits=waits, inrun_factor=1.2)
        doc = device_doc("cpu-cal", m, 8e9, jitter=True)
        text = profile_text(doc, {"kind": "fabric", "name": "f"}, m, [])
        return m, doc, next(x for x in text.splitlines() if x.startswith("# waits at"))

    def pct(text):
        return float(text.split(" ms (")[1].split("%)")[0])

    # cv 0.141 on a 100 ms op: the two ranks' times differ by about 2 * 0.141 * 0.1 / sqrt(pi)
    # = 16 ms, so each waits 8.0 ms beyond the shortest on average: more than the 4 ms measured
    m, doc, line = line_of(0.004)
    assert "shortest, 4.00 ms (mean over 10 collectives" in line and "no wake-up delay is needed" in line
    assert pct(line.split("alone gives the simulated ranks ")[1]) == pytest.approx(200, abs=10)
    assert "wake_delay_us" not in doc and wake_fit(m) == (0.0, 0.0)
    # 20 ms measured: the jitter gives 40% of it, a wake-up delay the rest
    m, doc, line = line_of(0.020)
    assert pct(line.split("alone gives the simulated ranks ")[1]) == pytest.approx(40, abs=3)
    assert pct(line.split("(wake_delay_us) ")[1]) == pytest.approx(100, abs=2)
    wake, floor = wake_fit(m)
    assert doc["wake_delay_us"] == pytest.approx(wake * 1e6) and wake > 0.004 and 0 < floor
    assert DeviceProfile.model_validate(doc).wake_delay_us == doc["wake_delay_us"]
    assert "in-run rows (**) are the shortest rank's times less" in line
    # steady ranks (--no-jitter): nothing drawn, so none of the waiting is
    steady = profile_text(device_doc("cpu-cal", m, 8e9), {"kind": "fabric", "name": "f"}, m, [])
    assert "alone gives the simulated ranks 0.00 ms (0%); no wake-up delay" in steady
