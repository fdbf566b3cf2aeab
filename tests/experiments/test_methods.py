"""The equal-compute comparison (oresearcher.experiments.methods): the fair verdict's own
promises, at CI size.

Equal compute across methods (every Compute FLOP counted, the cooperative program's
validators and shaped-loss peers included), the same statistic for every method, a
time-to-target read off the scored curve, and the verdict by hand; its command line,
benchmarks/bench_cooperation.py, refuses a bad task in one line.
"""
import subprocess
import sys

import pytest

from oresearcher.experiments import ablation as A
from oresearcher.experiments import methods as M


@pytest.fixture(scope="module")
def digits():
    return M.run_task("digits", [100], "quick", list(M.METHODS), log=lambda s: None, lrs=(1.0,))


def test_every_method_gets_the_cooperative_programs_compute(digits):
    target, rows = digits["target_flops"], digits["runs"][1.0]
    assert set(rows) == set(M.METHODS)
    coop = rows["oresearcher"]
    assert target == pytest.approx(sum(r["flops"] for r in coop) / len(coop))
    for m, runs in rows.items():
        for r in runs:
            assert r["flops"] == pytest.approx(target, rel=0.03), m
    # the cooperative program is charged for more than its own training steps: the
    # validators (and, where a variant runs them, the peers' forward passes of the shaped
    # loss, the ensemble and distillation). So at equal compute a data-parallel baseline
    # takes more steps than it did.
    assert digits["steps"]["ddp"] > coop[0]["steps"]
    ddp_per_step = rows["ddp"][0]["flops"] / rows["ddp"][0]["steps"]
    assert coop[0]["flops"] > 1.05 * ddp_per_step * coop[0]["steps"]
    assert "validate" in coop[0]["by_name"]
    assert "compute by op" not in M.compute_shares(coop) and "validate" in M.compute_shares(coop)
    distilled = A.run_variant("digits", "+ distillation", 100, 1.0, "quick")
    assert {"validate", "teacher_outputs", "distill_fwd_bwd"} <= set(distilled["by_name"])
    assert distilled["flops"] > coop[0]["flops"]


def test_the_same_statistics_for_every_method(digits):
    for m, runs in digits["runs"][1.0].items():
        for r in runs:
            assert 0.0 <= r["model"] <= 1.0 and 0.0 <= r["agents"] <= 1.0
            if m in ("single", "ddp"):  # one model / identical replicas: the deployed model is the agents'
                assert r["model"] == pytest.approx(r["agents"], abs=1e-6)
            # time-to-target: the first point of the scored curve at the target
            hits = [t for t, v in r["curve"] if v >= M.TASKS["digits"][1]]
            assert r["ttt"] == (hits[0] if hits else None)
            assert r["curve"][-1][1] == pytest.approx(r["agents"], abs=1e-6)  # the curve ends at the score


def test_equal_compute_steps_model_by_hand():
    assert M.flops_at(10, 4, 2.0, 5.0) == 10 * 2.0 + 2 * 5.0  # rounds of 4, 4, 2: two round ends count
    assert M.flops_at(8, 4, 2.0, 5.0) == 8 * 2.0 + 1 * 5.0


def test_paired_verdict_against_the_best_baseline_by_hand():
    rows = {"oresearcher": [{"model": x} for x in (0.9, 0.8, 0.85)],
            "single": [{"model": x} for x in (0.5, 0.45, 0.5)], "ddp": [{"model": x} for x in (0.6, 0.5, 0.6)]}
    best, word = M.verdict(rows, "model")
    assert best == "ddp" and word.startswith("wins")
    rows["oresearcher"] = [{"model": x} for x in (0.1, 0.2, 0.15)]
    assert M.verdict(rows, "model")[1].startswith("loses")


def test_a_loss_verdict_takes_the_lowest_baseline_and_a_lower_loss_wins():
    rows = {"oresearcher": [{"model_loss": x} for x in (3.0, 3.1, 3.05)],
            "single": [{"model_loss": x} for x in (4.0, 4.2, 4.1)], "ddp": [{"model_loss": x} for x in (3.5, 3.6, 3.4)]}
    best, word = M.verdict(rows, "model_loss", higher=False)
    assert best == "ddp" and word.startswith("wins")
    rows["oresearcher"] = [{"model_loss": x} for x in (5.0, 5.1, 5.2)]
    assert M.verdict(rows, "model_loss", higher=False)[1].startswith("loses")


def test_bad_task_is_one_line():
    p = subprocess.run([sys.executable, "benchmarks/bench_cooperation.py", "--tasks", "nope", "--plots", ""],
                       capture_output=True, text=True)
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
