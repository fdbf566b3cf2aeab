"""Compute jitter (DeviceProfile.compute_jitter_cv): off by default, mean-preserving,
reproducible from the seed, and it makes ranks wait for each other at collectives."""
import math
import statistics

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher import ops as O
from oresearcher.reporting.report import summarize
from oresearcher.sim.engine import Engine, lognormal_params

from simkit import DEVICE, topo

FLOPS = 1e9  # 1 ms on the 1 TFLOP/s golden device


def program(rank, steps, collective=True):
    for s in range(steps):
        yield O.Compute(flops=FLOPS)
        yield O.Compute(flops=FLOPS / 2)
        if collective:
            yield O.AllReduce(torch.empty(1024, device="meta"))
        yield O.StepDone(s)


def run(device, n=2, steps=20, seed=0, collective=True):
    tl = Engine(topo(n), device, "fp32", "ring", seed=seed).run([program(r, steps, collective) for r in range(n)])
    return tl, summarize(tl, {}, "sim")


def jittery(cv):
    return DEVICE.model_copy(update={"compute_jitter_cv": cv})


@pytest.mark.parametrize("cv", [0.01, 0.3, 1.0])
def test_lognormal_params_have_mean_one_and_the_cv(cv):
    mu, sigma = lognormal_params(cv)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(1.0, rel=1e-12)
    assert math.sqrt(math.exp(sigma**2) - 1) == pytest.approx(cv, rel=1e-12)


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 10**6))
def test_zero_jitter_leaves_the_engine_unchanged(seed):
    _, base = run(DEVICE)
    tl, rep = run(jittery(0.0), seed=seed)
    assert rep == base
    assert rep["peer_wait_time_s"] == 0.0
    # every Compute op took exactly its declared time
    for span in (s for s in tl.spans if s.cat == "compute"):
        assert span.duration in (pytest.approx(1e-3, rel=1e-9), pytest.approx(0.5e-3, rel=1e-9))


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([0.1, 0.3, 0.6]))
def test_jitter_keeps_the_mean_compute_time(seed, cv):
    # 2 ranks x 1500 steps x 2 ops; the standard error of the mean factor is
    # cv / sqrt(6000) <= 0.8 %, so 4 % is a five-sigma tolerance
    tl, _ = run(jittery(cv), steps=1500, seed=seed, collective=False)
    per_rank_total = [tl.totals[r]["compute"] for r in range(2)]
    declared = 1500 * 1.5e-3
    for total in per_rank_total:
        assert total == pytest.approx(declared, rel=0.04)
    # and the draws do vary, with roughly the stated spread (first ops of each step)
    firsts = [s.duration / 1e-3 for i, s in enumerate(x for x in tl.spans if x.cat == "compute" and x.rank == 0)
              if i % 2 == 0]
    assert statistics.pstdev(firsts) == pytest.approx(cv, rel=0.15)
    assert len(firsts) == 1500


def test_same_seed_same_report_other_seed_differs():
    a = run(jittery(0.2), seed=7)[1]
    b = run(jittery(0.2), seed=7)[1]
    c = run(jittery(0.2), seed=8)[1]
    assert a == b
    assert a["step_time_s"] != c["step_time_s"]


def test_jitter_makes_ranks_wait_for_each_other():
    _, steady = run(DEVICE, steps=200)
    _, noisy = run(jittery(0.2), steps=200)
    assert steady["peer_wait_time_s"] == 0.0
    assert noisy["peer_wait_time_s"] > 0.0
    # the group moves at the slower rank's pace: E[max] > mean of two draws
    assert noisy["step_time_s"] > steady["step_time_s"]
    assert noisy["exposed_comm_time_s"] > steady["exposed_comm_time_s"]
    # mean compute per rank stays as declared (1.5 ms per step), within 5 %
    assert noisy["compute_time_s"] == pytest.approx(steady["compute_time_s"], rel=0.05)


def persistent(cv, rho):
    return DEVICE.model_copy(update={"compute_jitter_cv": cv, "compute_jitter_rho": rho})


def step_factors(tl, rank):
    """Per step: the factor its first op was scaled by (1 ms declared)."""
    return [s.duration / 1e-3 for i, s in enumerate(x for x in tl.spans if x.cat == "compute" and x.rank == rank)
            if i % 2 == 0]


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([0.3, 0.6, 0.9]))
def test_persistent_jitter_is_an_ar1_over_steps_with_mean_one(seed, rho):
    cv = 0.2
    tl, _ = run(persistent(cv, rho), steps=4000, seed=seed, collective=False)
    for rank in range(2):
        spans = [s.duration for s in tl.spans if s.cat == "compute" and s.rank == rank]
        # both ops of a step share the factor
        assert all(b / 0.5e-3 == pytest.approx(a / 1e-3, rel=1e-9) for a, b in zip(spans[::2], spans[1::2]))
        f = step_factors(tl, rank)
        logs = [math.log(x) for x in f]
        m = statistics.fmean(logs)
        c = [x - m for x in logs]
        r1 = sum(a * b for a, b in zip(c, c[1:])) / sum(x * x for x in c)
        # lag-1 correlation of the log-factor: the standard error of the estimate is
        # about sqrt((1 - rho^2) / n) * sqrt((1 + rho^2)/(1 - rho^2))-ish; 0.06 is > 4 of them at n = 4000
        # for rho <= 0.6 and still loose at 0.9 (effective sample ~ n (1 - rho) / (1 + rho))
        assert r1 == pytest.approx(rho, abs=0.06 if rho < 0.8 else 0.1)
        # mean-one and the stated spread, per step (stationary from the first step)
        assert statistics.fmean(f) == pytest.approx(1.0, abs=0.05 if rho < 0.8 else 0.1)
        assert statistics.pstdev(f) == pytest.approx(cv, rel=0.2 if rho < 0.8 else 0.35)


def test_persistence_widens_the_drift_between_periodic_averagings():
    """Averaging every 10 steps: with the same per-step spread, persistent slowness
    makes the faster rank wait longer than independent draws do (E|sum of 10 diffs|)."""
    def periodic(rank, steps=2000):
        for s in range(steps):
            yield O.Compute(flops=FLOPS)
            if s % 10 == 9:
                yield O.AllReduce(torch.empty(1024, device="meta"))
            yield O.StepDone(s)

    def wait(device):
        tl = Engine(topo(2), device, "fp32", "ring", seed=3).run([periodic(r) for r in range(2)])
        return summarize(tl, {}, "sim")["peer_wait_time_s"]

    iid, ar = wait(persistent(0.1, 0.0)), wait(persistent(0.1, 0.7))
    # per block of 10 steps the difference of two sums has std sqrt(2 * 10 * VR) * cv * 1 ms with
    # VR = 1 (iid) and 1 + 2 sum_k (1 - k/10) 0.7^k = 4.16 (AR(1), rho 0.7 at the level of the
    # log-factor, about the same for the factor at cv 0.1): sqrt(4.16) = 2.04x the wait
    assert ar / iid == pytest.approx(2.04, rel=0.2)
