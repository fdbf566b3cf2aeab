"""benchmarks/bench_cooperation.py: the fair verdict's own promises, at CI size.

Equal compute across methods (every Compute FLOP counted, the cooperative program's
validators and shaped-loss peers included), the same statistic for every method, a
time-to-target read off the scored curve, PBT that really exploits, and the statistics
by hand.
"""
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
B = pytest.importorskip("bench_cooperation")
H = pytest.importorskip("coop_harness")


@pytest.fixture(scope="module")
def digits():
    return B.run_task("digits", [100], "quick", list(B.METHODS), log=lambda s: None, lrs=(1.0,))


def test_every_method_gets_the_cooperative_programs_compute(digits):
    target, rows = digits["target_flops"], digits["runs"][1.0]
    assert set(rows) == set(B.METHODS)
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
    assert "compute by op" not in B.compute_shares(coop) and "validate" in B.compute_shares(coop)
    A = pytest.importorskip("bench_ablation")
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
            hits = [t for t, v in r["curve"] if v >= B.TASKS["digits"][1]]
            assert r["ttt"] == (hits[0] if hits else None)
            assert r["curve"][-1][1] == pytest.approx(r["agents"], abs=1e-6)  # the curve ends at the score


def test_pbt_exploits_and_explores():
    sc = B.scenario("digits", "pbt", 100, 1.0, "quick", steps=24)
    report, learners, flops, by_name = H.simulate_counted(sc, H.pbt)
    mults = {m["lr_mult"] for recs in report["metrics"].values() for m in recs if "lr_mult" in m}
    assert mults - {1.0}, "no agent's learning rate was ever perturbed"
    assert {b["name"] for b in report["breakdown"]} >= {"param_gather", "score_gather"}
    assert flops > 0 and len(learners) == 4
    assert by_name["validate"] > 0 and sum(by_name.values()) == pytest.approx(flops)  # PBT's evaluations charged


def test_equal_compute_steps_model_by_hand():
    assert B.flops_at(10, 4, 2.0, 5.0) == 10 * 2.0 + 2 * 5.0  # rounds of 4, 4, 2: two round ends count
    assert B.flops_at(8, 4, 2.0, 5.0) == 8 * 2.0 + 1 * 5.0


def test_ci_and_paired_verdict_by_hand():
    m, lo, hi = B.ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(4.302653 / 3 ** 0.5, rel=1e-5) and m - lo == pytest.approx(hi - m)
    rows = {"oresearcher": [{"model": x} for x in (0.9, 0.8, 0.85)],
            "single": [{"model": x} for x in (0.5, 0.45, 0.5)], "ddp": [{"model": x} for x in (0.6, 0.5, 0.6)]}
    best, word = B.verdict(rows, "model")
    assert best == "ddp" and word.startswith("wins")
    rows["oresearcher"] = [{"model": x} for x in (0.1, 0.2, 0.15)]
    assert B.verdict(rows, "model")[1].startswith("loses")


def test_bad_task_is_one_line(capsys):
    assert B.main(["--tasks", "nope", "--plots", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
