"""Adding a strategy is one declaration: a toy strategy declared and registered here, in the
test file, without touching the package, loads in a scenario, runs in the simulator and in
the reference interpreter with the same values, and is refused at load where its
declaration says it cannot run."""
from pathlib import Path

import pytest
import torch

from oresearcher.errors import UserError
from oresearcher.ops import AllReduce, Compute, StepDone
from oresearcher.programs import AgentContext
from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import simulate
from oresearcher.strategies import Strategy, get_strategy, register_strategy, unregister_strategy
from oresearcher.tasks import make_learner
from oresearcher.testing import run_programs

DIGITS4 = Path(__file__).resolve().parents[2] / "scenarios" / "digits-4.yaml"
TINY = ["training.strategy=toy_average", "training.steps=3", "agents.roles=null"]


def toy_average(ctx, learner):
    """Every step: a local step, then the parameters averaged over the group (local SGD with H=1)."""
    for step in range(ctx.start_step, ctx.steps):
        metrics = yield Compute(learner.forward_backward, flops=learner.fwd_flops + learner.bwd_flops, name="fwd_bwd")
        yield Compute(learner.optimizer_step, name="optimizer")
        flat = yield Compute(learner.flat_params, name="pack")
        avg = yield AllReduce(flat, group=ctx.group, op="avg", name="param_average")
        yield Compute(learner.set_flat_params, avg, name="unpack")
        ctx.mark_boundary(step)
        yield StepDone(step, metrics)


def _no_codec(scenario):
    if not scenario.communication.codec.is_none:
        raise ValueError("communication.codec: toy_average averages exact parameters; set it to none")


TOY = Strategy(name="toy_average", program=toy_average, summary="parameters averaged after every local step",
               shares_model=True, symmetric_ranks=True, check=_no_codec)


@pytest.fixture
def toy():
    register_strategy(TOY)
    yield TOY
    unregister_strategy(TOY.name)


def test_the_toy_is_resolved_at_load_and_named_in_the_report(toy):
    sc = load_scenario(DIGITS4, TINY)
    assert sc.strategy is toy and get_strategy("toy_average") is toy
    assert sc.resolved()["training"]["strategy"] == "toy_average"  # the string stays in the field


def test_the_simulator_and_the_reference_interpreter_run_the_toy_alike(toy):
    sc = load_scenario(DIGITS4, TINY)
    report, _ = simulate(sc)
    assert report["scenario"]["training"]["strategy"] == "toy_average" and report["mode"] == "numeric"
    learners = [make_learner(sc, r, mode="numeric") for r in range(sc.world_size)]
    steps = run_programs([sc.strategy.program_fn(AgentContext(r, sc.world_size, sc, mode="numeric"), lr)
                          for r, lr in enumerate(learners)])
    for r in range(sc.world_size):
        simulated = [m["loss"] for m in report["metrics"][str(r)]]
        assert simulated == [s.metrics["loss"] for s in steps[r]]  # the same values, op for op
    first = learners[0].flat_params()
    assert all(torch.equal(first, lr.flat_params()) for lr in learners[1:])  # averaged: one model


def test_what_the_toy_declares_it_cannot_do_is_refused_at_load(toy):
    with pytest.raises(UserError, match="communication.codec: toy_average averages exact parameters"):
        load_scenario(DIGITS4, [*TINY, "communication.codec=int8"])
    with pytest.raises(UserError, match="agents.architectures: training.strategy toy_average trains one model"):
        load_scenario(DIGITS4, [*TINY, "agents.architectures=[mlp, cnn, mlp, mlp]"])


def test_a_toy_cannot_take_a_shipped_name_and_is_unknown_once_unregistered():
    with pytest.raises(ValueError, match="shipped"):
        register_strategy(Strategy(name="ddp", program=toy_average))
    with pytest.raises(UserError, match="unknown strategy 'toy_average'"):
        load_scenario(DIGITS4, TINY)
