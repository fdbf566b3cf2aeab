"""benchmarks/bench_fsdp_sim_to_real.py: the measured steady step (steps after the
first two, the slowest rank's) on a hand-made report."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_fsdp_sim_to_real as bench  # noqa: E402


def _report(ends: dict) -> dict:
    steps = len(next(iter(ends.values())))
    return {"step_time_s": max(t[-1] for t in ends.values()) / steps,
            "metrics": {r: [{"time_s": t} for t in ts] for r, ts in ends.items()}}


def test_steady_step_leaves_out_the_first_two_steps():
    # rank 0: a 0.3 s first step, then 0.1 s steps; rank 1: 0.12 s steps after its second
    rep = _report({"0": [0.3, 0.4, 0.5, 0.6, 0.7], "1": [0.3, 0.42, 0.54, 0.66, 0.78]})
    got = bench.steady(rep)
    assert got["step_time_s"] == pytest.approx((0.78 - 0.42) / 3)  # the slowest rank, steps 3..5
    assert got["first_steps_step_time_s"] == pytest.approx(0.78 / 5)
    assert rep["step_time_s"] == pytest.approx(0.78 / 5)  # the report itself is left alone


def test_steady_step_needs_steps_past_the_warmup():
    with pytest.raises(SystemExit, match="more than 2 steps"):
        bench.steady(_report({"0": [0.3, 0.4]}))
