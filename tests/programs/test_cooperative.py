"""End-to-end runs of the cooperative program (oresearcher.programs.cooperative).

4 agents for a few rounds in the reference interpreter, the simulator and on gloo, plus
the promises the program makes: compute per round constant, flagged agents excluded
and healed, every role switch logged with its reason, heterogeneous architectures.
"""
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oresearcher import ops as O
from oresearcher.programs import AgentContext, get_program
from oresearcher.programs.cooperative_exchange import arch_group, initial_lr_mult, round_lengths, step_cost
from oresearcher.models.learner import ShapeLearner
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.testing import run_programs, tap

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "scenarios" / "digits-4.yaml"
SMALL = ["training.steps=24", "communication.interval=6"]


def _scenario(*overrides, path=DIGITS):
    return load_scenario(path, SMALL + list(overrides))


def _run(sc, learners=None, wrap=None):
    n = sc.world_size
    learners = learners or [make_learner(sc, r, mode="numeric") for r in range(n)]
    prog = get_program(sc.training.strategy)
    gens = [prog(AgentContext(r, n, sc, mode="numeric"), l) for r, l in enumerate(learners)]
    if wrap:
        gens = [wrap(r, g) for r, g in enumerate(gens)]
    return run_programs(gens), learners


def test_helpers():
    assert round_lengths(24, 6) == [6] * 4 and round_lengths(25, 10) == [10, 10, 5]
    assert step_cost("optimizer", "sam") == 2 and step_cost("optimizer", "swa") == 1 and step_cost("explorer", "sam") == 1
    assert arch_group(["a", "a", "b", "b"], 2) == (2, 3) and arch_group(["a"] * 3, 0) is None
    assert initial_lr_mult(0, 4, (0.1, 10.0)) == initial_lr_mult(0, 4, (0.1, 10.0))
    lrs, knobs = initial_lr_mult(3, 8, (0.1, 10.0), (0.5, 2.0))
    assert all(0.1 <= m <= 10.0 for m in lrs) and all(0.5 <= m <= 2.0 for m in knobs)
    assert initial_lr_mult(3, 4, (1.0, 1.0)) == ([1.0] * 4, [1.0] * 4)  # PBT's sampling off


def _recorder(log):
    def wrap(rank, gen):
        rnd = 0

        def on_op(op):
            nonlocal rnd
            if isinstance(op, O.Compute):
                log.append((rank, rnd, op.name, op.flops))
            if isinstance(op, O.StepDone) and "reward" in op.metrics:
                rnd += 1
        return (yield from tap(gen, on_op))
    return wrap


def test_four_agents_reference_interpreter(caplog):
    sc = _scenario("cooperation.roles.optimizer_method=sam")
    ops = []
    with caplog.at_level(logging.INFO, logger="oresearcher.programs.cooperative"):
        steps, learners = _run(sc, wrap=_recorder(ops))
    rounds = [[s.metrics for s in per if "reward" in s.metrics] for per in steps]
    assert all(len(r) == 4 for r in rounds)  # one round-end record per round per agent
    finals = [per[-1].metrics for per in steps]
    for f in finals:
        assert 0.0 <= f["test_accuracy"] <= 1.0 and math.isfinite(f["final_reliability"])
        assert f["role"] in (0, 1, 2)
    results = [l.cooperative_result for l in learners]
    assert all(r["roles"] == results[0]["roles"] for r in results)  # every rank decided the same
    assert "validator" in results[0]["roles"]
    assert results[0]["reliability"] == pytest.approx(results[3]["reliability"])
    # compute per round is constant: units of fwd-bwd (SAM counts 2) spent by the end of
    # each round add up to n * interval per round so far, less what is carried over (under
    # one SAM step per agent); a round alone may spend what the previous one carried
    spent = 0
    for rnd in range(4):
        spent += sum(2 if name == "sam_fwd_bwd" else 1 for _, r, name, _ in ops
                     if r == rnd and name in ("fwd_bwd", "sam_fwd_bwd"))
        assert 4 * 6 * (rnd + 1) - 4 <= spent <= 4 * 6 * (rnd + 1)
    sam = [f for _, _, name, f in ops if name == "sam_fwd_bwd"]
    plain = [f for _, _, name, f in ops if name == "fwd_bwd"]
    assert sam and plain and sam[0] == pytest.approx(2 * plain[0])  # SAM charged twice
    # role switches carry their reason, in the log and in the metrics
    switched = [m for per in rounds for m in per if "role_switch" in m]
    assert switched, "this scenario's difficulty schedule switches roles; none switched"
    logged = [r.getMessage() for r in caplog.records if "role" in r.getMessage() and "->" in r.getMessage()]
    assert len(switched) == len(logged)
    for m in switched:
        assert "difficulty" in m["role_switch"]


def test_reference_runs_are_deterministic():
    a, la = _run(_scenario("training.steps=12"))
    b, lb = _run(_scenario("training.steps=12"))
    for x, y in zip(la, lb):
        assert torch.equal(x.flat_params(), y.flat_params())
    assert [s.metrics.get("reward") for s in a[1]] == [s.metrics.get("reward") for s in b[1]]


class _Poisoned:
    """Wraps a learner; after ``at`` forward passes its parameters become NaN."""

    def __init__(self, inner, at):
        self.inner, self.at, self.calls = inner, at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_backward(self):
        self.calls += 1
        if self.calls == self.at:
            with torch.no_grad():
                for p in self.inner.params:
                    p.fill_(float("nan"))
        return self.inner.forward_backward()


def test_diverged_agent_is_flagged_excluded_and_healed():
    sc = _scenario("cooperation.roles.policy=static", "cooperation.allocation.enabled=false",
                   "cooperation.roles.optimizer_method=swa")
    learners = [make_learner(sc, r, mode="numeric") for r in range(4)]
    learners[1] = _Poisoned(learners[1], at=8)  # agent 1 (6 steps a round) breaks in round 1
    assert sc.communication.gradient_sharing  # its NaN gradients must not spread either
    steps, _ = _run(sc, learners)
    rounds = [[s.metrics for s in per if "reward" in s.metrics] for per in steps]
    assert rounds[1][1]["excluded"] == 1.0
    assert all(rounds[r][1]["excluded"] == 0.0 for r in range(4) if r != 1)
    # nobody else took any of its weight: everyone stays finite, and it was healed by fusion
    for l in learners:
        assert bool(torch.isfinite(l.flat_params()).all())
    assert steps[1][-1].metrics["final_excluded"] == 0.0


def test_heterogeneous_architectures_and_gradient_sharing():
    sc = _scenario("agents.architectures=[mlp, mlp, cnn, cnn]", "communication.gradient_sharing=true",
                   "cooperation.roles.optimizer_method=swa")
    ops = []
    steps, learners = _run(sc, wrap=_recorder(ops))
    assert learners[0].numel != learners[2].numel
    assert all(math.isfinite(per[-1].metrics["test_accuracy"]) for per in steps)
    assert any(name == "swa" for _, _, name, _ in ops)


def test_shape_mode_runs_and_keeps_roles():
    sc = _scenario("training.steps=8", "communication.interval=4")
    learners = [ShapeLearner([100, 10], 1e6, 2e6, dtype=torch.float32) for _ in range(4)]
    prog = get_program("oresearcher")
    gens = [prog(AgentContext(r, 4, sc, mode="shape"), l) for r, l in enumerate(learners)]
    steps = run_programs(gens)
    assert all(len(s) > 0 for s in steps)
    roles = [s[-1].metrics["role"] for s in steps]
    assert roles == [0, 1, 1, 2]  # the initial mix: explorer, optimizer x2, validator


def test_cartpole_four_agents():
    sc = load_scenario(ROOT / "scenarios" / "cartpole-4.yaml", ["training.steps=20", "communication.interval=10"])
    steps, learners = _run(sc)
    assert all(per[-1].metrics["test_return"] >= 1 for per in steps)
    assert all(l.reward_weights is not None for l in learners)  # the reward is the return they optimise
    assert len({tuple(l.cooperative_result["roles"]) for l in learners}) == 1


def test_simulator_matches_reference():
    simulate = pytest.importorskip("oresearcher.sim.simulate").simulate
    sc = _scenario("training.steps=12")
    report, _ = simulate(sc)
    ref, _ = _run(sc)
    for r in range(4):
        sim_last = report["metrics"][str(r)][-1]
        assert sim_last["test_accuracy"] == pytest.approx(ref[r][-1].metrics["test_accuracy"])
        assert sim_last["reward"] == pytest.approx(ref[r][-1].metrics["reward"])
    names = {b["name"] for b in report["breakdown"]}
    assert {"param_gather", "score_gather"} <= names
    assert report["total_time_s"] > 0


def test_gloo_end_to_end(tmp_path):
    pytest.importorskip("oresearcher.run")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--scenario", str(DIGITS), "--steps=12",
           "--communication_interval=6", "--set", "communication.gradient_sharing=false", "--out", str(tmp_path),
           "--no-tensorboard", "--no-progress", "--timeout=60"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    last = [report["metrics"][str(r)][-1] for r in range(4)]
    assert all(0.0 <= m["test_accuracy"] <= 1.0 for m in last)
    sc = _scenario("training.steps=12", "communication.gradient_sharing=false")
    ref, _ = _run(sc)  # all-gathers move values exactly: gloo reproduces the reference interpreter
    assert [m["role"] for m in last] == [ref[r][-1].metrics["role"] for r in range(4)]
    for r in range(4):
        assert last[r]["test_accuracy"] == pytest.approx(ref[r][-1].metrics["test_accuracy"], abs=1e-6)
        assert last[r]["final_reliability"] == pytest.approx(ref[r][-1].metrics["final_reliability"], abs=1e-6)
        assert last[r]["reward"] == pytest.approx(ref[r][-1].metrics["reward"], abs=1e-6)


@pytest.mark.parametrize("override, field", [
    ("cooperation.fusion.temperature=0", "cooperation.fusion.temperature"),
    ("cooperation.roles.policy=off", "cooperation.roles.policy"),
    ("cooperation.allocation.floor=1.5", "cooperation.allocation.floor"),
    ("cooperation.rewards.schedule=exp", "cooperation.rewards.schedule"),
    ("cooperation.roles.exploit_fraction=0.7", "cooperation.roles.exploit_fraction"),
    ("cooperation.fusion.colour=red", "cooperation.fusion.colour"),
    ("cooperation.rewards.shape_loss=sometimes", "cooperation.rewards.shape_loss"),
    ("cooperation.rewards.peer_term=repel", "cooperation.rewards.peer_term"),
    ("cooperation.rewards.agreement_weight=-1", "cooperation.rewards.agreement_weight"),
    ("cooperation.roles.lr_range=[2, 1]", "cooperation.roles"),  # lo > hi: named with its values
    ("cooperation.roles.lr_range=[0, 1]", "cooperation.roles.lr_range"),
    ("cooperation.roles.perturb_factor=0.5", "cooperation.roles.perturb_factor"),
    ("cooperation.roles.validation_share=0", "cooperation.roles.validation_share"),
    ("distill.init=warm", "distill.init"),
])
def test_cooperation_fields_are_validated(override, field):
    from oresearcher.errors import UserError

    with pytest.raises(UserError, match=field.replace(".", r"\.")):
        load_scenario(DIGITS, [override])


def test_cooperation_fields_are_documented():
    from oresearcher.scenario import CooperationSpec

    for section in CooperationSpec.model_fields.values():
        for name, f in section.annotation.model_fields.items():
            assert f.description, f"cooperation field {name} has no description"


def test_reward_shapes_the_digits_loss_and_peer_passes_are_charged():
    ops_on, ops_off = [], []
    on, l_on = _run(_scenario("training.steps=12", "cooperation.roles.optimizer_method=swa",
                              "cooperation.rewards.peer_term=diversity"), wrap=_recorder(ops_on))
    off, l_off = _run(_scenario("training.steps=12", "cooperation.roles.optimizer_method=swa",
                                "cooperation.rewards.shape_loss=false"), wrap=_recorder(ops_off))
    base = l_off[0].base_fwd_flops + l_off[0].bwd_flops
    assert {f for _, _, name, f in ops_off if name == "fwd_bwd"} == {base}
    assert all(l.peers == [] and l.reward_weights is not None for l in l_off)
    # round 0 has no snapshot yet: plain CE, the same run as without shaping
    r0 = lambda steps: [s.metrics["loss"] for s in steps[0] if s.metrics.get("round") == 0]  # noqa: E731
    assert len(r0(on)) >= 5 and r0(on) == r0(off)
    # then each step also runs the 3 peers (same mlp): 3 more forward passes charged
    later = {f for _, r, name, f in ops_on if name == "fwd_bwd" and r >= 1}
    assert later == {base + 3 * l_on[0].base_fwd_flops}
    assert all(len(l.peers) == 3 for l in l_on)
    assert not torch.equal(l_on[0].flat_params(), l_off[0].flat_params())


def test_one_agent_trains_as_without_shaping():
    runs = [_run(_scenario("training.steps=12", "agents.count=1", "agents.roles=null", f"cooperation.rewards.shape_loss={v}"))
            for v in ("true", "false")]
    assert torch.equal(runs[0][1][0].flat_params(), runs[1][1][0].flat_params())
    assert runs[0][1][0].peers == []


def test_no_peer_term_is_the_default_and_runs_no_peer_forwards():
    ops = []
    _, learners = _run(_scenario("training.steps=12", "cooperation.roles.optimizer_method=swa"), wrap=_recorder(ops))
    base = learners[0].base_fwd_flops + learners[0].bwd_flops
    assert {f for _, _, name, f in ops if name == "fwd_bwd"} == {base}
    assert all(l.peers == [] and l.peer_term == "none" for l in learners)
    _, shaped = _run(_scenario("training.steps=12", "cooperation.roles.optimizer_method=swa",
                               "cooperation.rewards.peer_term=agreement"))
    assert {(l.peer_term, l.agreement > 0, len(l.peers)) for l in shaped} == {("agreement", True, 3)}
