"""Population-based training alone (oresearcher.programs.pbt), the comparison's PBT
baseline: it really exploits and explores, and its evaluations are charged."""
import pytest

from oresearcher.experiments import methods as M
from oresearcher.experiments.counted import simulate_counted
from oresearcher.programs.pbt import pbt


def test_pbt_exploits_and_explores():
    sc = M.scenario("digits", "pbt", 100, 1.0, "quick", steps=24)
    report, learners, flops, by_name = simulate_counted(sc, pbt)
    mults = {m["lr_mult"] for recs in report["metrics"].values() for m in recs if "lr_mult" in m}
    assert mults - {1.0}, "no agent's learning rate was ever perturbed"
    assert {b["name"] for b in report["breakdown"]} >= {"param_gather", "score_gather"}
    assert flops > 0 and len(learners) == 4
    assert by_name["validate"] > 0 and sum(by_name.values()) == pytest.approx(flops)  # PBT's evaluations charged
