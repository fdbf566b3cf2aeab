"""The overhead controller's experiment (oresearcher.experiments.budget) at other horizons,
as benchmarks/bench_budget.py offers them: ``--lm-steps`` (synthetic-lm at another
horizon, fusion still every 12), ``--rows key`` (the reference and the controller only)
and ``--curve`` (training loss by round, the controller's decisions). The defaults must
stay what the README block holds; the helpers are checked on hand-made reports and one
short real run, the script's bad options as it runs.
"""
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oresearcher.experiments import budget as B


def test_default_lm_settings_are_the_readme_blocks():
    sets = B.lm_sets()
    assert sets == B.LM_SETS
    assert "training.steps=48" in sets and "communication.interval=12" in sets


def test_lm_steps_changes_only_the_step_count():
    a, b = B.lm_sets(48), B.lm_sets(384)
    assert "training.steps=384" in b and "training.steps=48" not in b
    assert [s for s in a if not s.startswith("training.steps=")] == [
        s for s in b if not s.startswith("training.steps=")]


def test_rows_key_keeps_the_reference_and_the_controller():
    everything = [name for name, _ in B.configs(0.083)]
    assert everything == ["share every 1", "share every 10", "share every 100", "share every 1000",
                          "controller, budget 0.083"]
    key = B.configs(0.083, "key")
    assert [name for name, _ in key] == ["share every 1", "controller, budget 0.083"]
    assert key[1][1] == ["communication.budget=0.083"]


def test_round_losses_by_hand():
    report = {"metrics": {
        "0": [{"round": 0, "loss": 4.0}, {"round": 0, "loss": 2.0}, {"round": 1, "loss": 1.0}],
        "1": [{"round": 1, "loss": 3.0}, {"round": 0, "loss": float("nan")}, {"loss": 9.0}],
    }}
    # round 0: (4 + 2) / 2 (the NaN is skipped); round 1: (1 + 3) / 2; no round: ignored
    assert B.round_losses(report) == [3.0, 2.0]


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 20, allow_nan=False)), min_size=1, max_size=40))
def test_round_losses_stay_within_each_rounds_range(entries):
    report = {"metrics": {"0": [{"round": r, "loss": x} for r, x in entries]}}
    got = B.round_losses(report)
    rounds = sorted({r for r, _ in entries})
    assert len(got) == len(rounds)
    for r, mean in zip(rounds, got):
        xs = [x for q, x in entries if q == r]
        assert min(xs) - 1e-9 <= mean <= max(xs) + 1e-9


def test_decisions_read_rank_0_after_each_round():
    report = {"metrics": {"0": [
        {"loss": 1.0},
        {"budget_rung": 2.0, "budget_widen": 1.0, "budget_codec": "int8"},
        {"budget_rung": 0.0, "budget_widen": 4.0, "budget_codec": ""},
    ], "1": [{"budget_rung": 9.0, "budget_widen": 9.0, "budget_codec": "x"}]}}
    assert B.decisions(report) == ["2 w1 int8", "0 w4 fp32"]
    assert B.decisions({"metrics": {"0": [{"loss": 1.0}]}}) == []


@pytest.mark.parametrize("argv", [["--lm-steps", "50"], ["--lm-steps", "0"], ["--rows", "two"], ["--seeds", "0"]])
def test_bad_options_exit_2(argv):
    p = subprocess.run([sys.executable, "benchmarks/bench_budget.py", "--tasks", "lm", *argv],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr


def test_a_short_horizon_runs_one_round_per_12_steps():
    row = B.quality_row("lm", ["communication.budget=0.083", "cooperation.roles.optimizer_method=swa"], [0],
                        lm_steps=24)
    assert len(row["curve"]) == 2 and all(math.isfinite(x) for x in row["curve"])
    assert len(row["decisions"]) == 1  # one decision: after round 0 of 2
    assert 0.0 <= row["acc"] <= 1.0


def test_round_curve_takes_each_rounds_last_rank_by_hand():
    report = {"metrics": {
        "0": [{"round": 0, "loss": 4.0, "time_s": 0.010}, {"round": 1, "loss": 1.0, "time_s": 0.030}],
        "1": [{"round": 0, "loss": 2.0, "time_s": 0.012}, {"round": 1, "loss": 3.0, "time_s": 0.029}],
    }}
    assert B.round_curve(report) == [(0.012, 3.0), (0.030, 2.0)]


def test_time_to_target_is_the_first_round_at_or_below_it():
    curve = [(0.01, 3.0), (0.02, 2.5), (0.03, 2.0), (0.04, 2.2)]
    assert B.time_to_target(curve, 2.5) == 0.02  # at or below
    assert B.time_to_target(curve, 2.1) == 0.03
    assert B.time_to_target(curve, 1.9) == math.inf


def test_time_to_target_rows_by_hand():
    """The common target: the highest final loss of any row, each the mean over its seeds:
    the reference ends at 2.0 and 3.0 (2.5), the other at 2.0 and 4.0 (3.0): 3.0. The
    reference reaches it at 0.01 s (seed 0) and 0.03 s (seed 1); the other at 0.01 s
    once and never in the other seed (it ends at 4.0): half the seeds is not enough."""
    ref = {"curves": [[(0.01, 3.0), (0.02, 2.7), (0.03, 2.0)], [(0.01, 4.0), (0.03, 2.75), (0.04, 3.0)]]}
    other = {"curves": [[(0.01, 2.0)], [(0.01, 5.0), (0.02, 4.0)]]}
    rows = B.with_time_to_target({"share every 1": ref, "controller": other})
    assert ref["target"] == other["target"] == pytest.approx(3.0)
    assert ref["ttt"] == [0.01, 0.03] and other["ttt"] == [0.01, math.inf]
    assert B.ttt_cell(ref, ref) == "20.0 ms (1.00x)"
    assert B.ttt_cell(other, ref) == "not reached (reached in 1 of 2 seeds)"
    other["curves"].append([(0.02, 1.0)])  # a third seed: its mean final (2 + 4 + 1) / 3 < 2.5
    B.with_time_to_target(rows)
    assert ref["target"] == pytest.approx(2.5)  # now the reference's (2 + 3) / 2 is the highest
    assert ref["ttt"] == [0.03, math.inf] and other["ttt"] == [0.01, math.inf, 0.02]
    assert B.ttt_cell(other, ref) == "20.0 ms (1 seed(s) not)"  # no ratio to a reference that misses
