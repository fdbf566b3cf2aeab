"""The reference run is the seed's system: scenarios/8xA100.yaml runs the overhead
controller at the seed's 8.3% budget, and its table says in one line what the overhead
would be without it."""
from pathlib import Path

from oresearcher.reporting.console import print_report
from oresearcher.scenario import load_scenario
from oresearcher.sim import simulate as S

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_meets_the_seeds_budget_and_says_what_it_would_be_without(capsys):
    sc = load_scenario(ROOT / "scenarios" / "8xA100.yaml")
    assert sc.communication.budget == 0.083
    report, _ = S.simulate(sc, keep_spans=0)
    plain = report["without_controller"]
    assert report["comm_overhead"] <= 0.083 < plain["comm_overhead"]
    assert plain["step_time_s"] > report["step_time_s"]  # the SAM optimizers' waits, balanced away
    print_report(report, "8xA100")
    out = capsys.readouterr().out
    assert "without the overhead controller" in out and f"{plain['comm_overhead']:.2%}" in out


def test_a_strategy_that_ignores_the_budget_has_no_such_line():
    sc = load_scenario(ROOT / "scenarios" / "8xA100.yaml", ["training.strategy=ddp", "training.steps=2"])
    report, _ = S.simulate(sc, keep_spans=0)
    assert not S.controlled(report) and "without_controller" not in report
