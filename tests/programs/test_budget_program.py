"""communication.budget inside the cooperative program: simulator and reference interpreter."""
import re

import pytest

from oresearcher.programs import AgentContext, get_program
from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import simulate
from oresearcher.tasks import make_learner
from oresearcher.testing import run_programs

TINY = ["training.strategy=oresearcher", "training.steps=24", "communication.interval=6",
        "agents.roles.explorer=2", "agents.roles.optimizer=2", "simulation.mode=shape"]  # SAM optimizers


def _sim(*extra):
    return simulate(load_scenario("scenarios/cpu-tiny.yaml", TINY + list(extra)))[0]


def _decisions(report):
    """Per rank: the budget reasons of its round-end StepDones."""
    return {r: [m["budget_reason"] for m in ms if "budget_reason" in m] for r, ms in report["metrics"].items()}


def test_absent_budget_waits_for_sam_agents_and_the_controller_removes_it():
    base, ctl = _sim(), _sim("communication.budget=0.05")
    assert base["comm_overhead"] > 0.3 and base["peer_wait_time_s"] > 0.3 * base["step_time_s"]
    assert ctl["comm_overhead"] < 0.05 and ctl["peer_wait_time_s"] < 1e-3 * ctl["step_time_s"]
    dec = _decisions(ctl)
    assert len(dec["0"]) == 3 and all(d == dec["0"] for d in dec.values())  # one decision, every rank
    costs = [float(c) for c in re.search(r"step costs \[(.*?)\]", dec["0"][0]).group(1).split(", ")]
    k = [int(x) for x in re.search(r"k=\[(.*?)\]", dec["0"][0]).group(1).split(", ")]
    assert 1 in k and 2 in k  # SAM agents share every step, the others every second: all arrive together
    assert max(ki * c for ki, c in zip(k, costs)) == pytest.approx(min(ki * c for ki, c in zip(k, costs)), rel=0.02)


def test_tight_budget_tightens_the_codec_and_sends_fewer_bytes():
    base, ctl = _sim("communication.budget=0.5"), _sim("communication.budget=0.005")
    rungs = [m["budget_rung"] for m in ctl["metrics"]["0"] if "budget_rung" in m]
    assert rungs[-1] > 0 and rungs == sorted(rungs)
    assert ctl["wire_bytes_per_step"] < 0.7 * base["wire_bytes_per_step"]
    assert "over budget" in _decisions(ctl)["0"][0]


def test_round_end_bound_run_holds_the_sharing_and_reports_the_floor():
    """digits-4: the validators' scoring and the parameter gather at the round's end are
    over any budget; every round reports the floor under the measured overhead and says so."""
    r = simulate(load_scenario("scenarios/digits-4.yaml", ["training.steps=60", "communication.interval=15",
                                                           "communication.budget=0.083"]))[0]
    rounds = [m for m in r["metrics"]["0"] if "budget_floor" in m]
    assert len(rounds) == 3
    for m in rounds:
        assert 0.083 < m["budget_floor"] <= m["budget_overhead"] + 1e-9
        assert "the round's end alone is" in m["budget_reason"]
        assert "fusion interval" in m["budget_reason"]


def test_reference_interpreter_without_clock_runs_numeric_digits():
    sc = load_scenario("scenarios/digits-4.yaml", ["training.steps=12", "communication.interval=4",
                                                   "communication.budget=0.083"])
    n = sc.world_size
    gens = [get_program("oresearcher")(AgentContext(r, n, sc, mode="numeric"), make_learner(sc, r, mode="numeric"))
            for r in range(n)]
    run_programs(gens)
    ctx = AgentContext(0, n, sc, mode="numeric")
    assert ctx.clock is None


@pytest.mark.parametrize("bad", ["0", "1", "-0.1", "x"])
def test_budget_is_validated(bad):
    with pytest.raises(Exception, match="budget"):
        load_scenario("scenarios/digits-4.yaml", [f"communication.budget={bad}"])


def test_resumed_agent_keeps_the_controllers_rung_and_k():
    from oresearcher.cooperation.budget_round import BudgetRun

    sc = load_scenario("scenarios/cpu-tiny.yaml", TINY + ["communication.budget=0.005"])
    first = AgentContext(0, 4, sc, mode="shape")
    run = BudgetRun(first, lambda: [1, 1, 2, 1])
    run.state.rung, run.state.k, run.state.last_tighten = 3, [4, 4, 2, 4], 2
    saved = {name: obj.state_dict() for name, obj in first.state.items()}
    again = BudgetRun(AgentContext(0, 4, sc, mode="shape", restored=saved), lambda: [1, 1, 2, 1])
    assert again.state.state_dict() == run.state.state_dict()  # no fresh first-round decision
