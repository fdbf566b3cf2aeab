"""Divergence (oresearcher.programs.divergence): a non-finite loss, gradient or parameter on one rank
is caught before it is shared, in every data-parallel strategy and the cooperative program,
on the reference interpreter; policy stop ends in one line naming rank and step, skip
leaves the rank out and restores it, and nothing healthy left is a clear stop."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from oresearcher.programs import divergence as D
from oresearcher.errors import UserError
from oresearcher.programs import AgentContext, get_program
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.testing import run_programs

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "scenarios" / "digits-4.yaml"
NAN = float("nan")


class Poisoned:
    """Delegates to ``inner``; on the forward/backward calls in ``at`` (0-based) it makes
    the gradients NaN ("grad"), or the loss and every parameter NaN from then on
    ("params", as a blown-up model is). Records what apply_grads and set_flat_params get."""

    def __init__(self, inner, at=(), what="grad"):
        self.inner, self.at, self.what, self.calls = inner, set(at), what, 0
        self.applied, self.set_to = [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_backward(self):
        metrics = self.inner.forward_backward()
        k, self.calls = self.calls, self.calls + 1
        if k in self.at:
            with torch.no_grad():
                for p in self.inner.params:
                    (p.grad if self.what == "grad" else p).fill_(NAN)
            if self.what != "grad":
                metrics = dict(metrics, loss=NAN)
        return metrics

    def apply_grads(self, buckets):
        self.applied.append([b.clone() for b in buckets])
        return self.inner.apply_grads(buckets)

    def set_flat_params(self, flat):
        self.set_to.append(flat.clone())
        return self.inner.set_flat_params(flat)


def _scenario(strategy, *extra, n=2):
    return load_scenario(DIGITS, [f"training.strategy={strategy}", "training.steps=9", "training.local_steps=3",
                                  f"agents.count={n}", "agents.roles=null", "workload.optimizer=sgd",
                                  "training.lr=0.05", *extra])


def _run(sc, poison: dict, what="grad"):
    """poison: rank -> forward/backward calls to poison."""
    n = sc.world_size
    learners = [Poisoned(make_learner(sc, r, mode="numeric"), poison.get(r, ()), what) for r in range(n)]
    prog = get_program(sc.training.strategy)
    steps = run_programs([prog(AgentContext(r, n, sc, mode="numeric"), l) for r, l in enumerate(learners)])
    return steps, learners


def test_find_names_what_is_non_finite_and_ignores_meta():
    ok = torch.ones(3)
    assert D.find(1.0, [ok], [ok]) is None
    assert D.find(NAN, [ok]) == "loss" and D.find(math.inf) == "loss"
    assert D.find(1.0, [torch.tensor([1.0, -math.inf])]) == "gradient"
    assert D.find(params=[torch.tensor([NAN])]) == "parameters"
    assert not D.non_finite([torch.empty(5, device="meta"), None, torch.empty(0)])


def test_policy_defaults_to_skip_for_the_cooperative_program_and_stop_otherwise():
    assert D.policy(_scenario("ddp")) == "stop" and D.policy(_scenario("local_sgd")) == "stop"
    assert D.policy(load_scenario(DIGITS)) == "skip"
    assert D.policy(_scenario("ddp", "training.on_divergence=skip")) == "skip"
    with pytest.raises(UserError, match="training.on_divergence"):
        _scenario("ddp", "training.on_divergence=ignore")


@pytest.mark.parametrize("strategy", ["ddp", "local_sgd", "diloco", "single"])
def test_stop_names_rank_and_step_before_anything_is_shared(strategy):
    sc = _scenario(strategy)
    with pytest.raises(D.Diverged) as e:
        _run(sc, {1: [4]})
    msg = str(e.value)
    assert msg.startswith("rank 1 diverged at step 4: non-finite gradient") and "\n" not in msg


def test_ddp_skip_averages_the_healthy_gradients_and_keeps_ranks_identical():
    sc = _scenario("ddp", "training.on_divergence=skip")
    steps, (a, b) = _run(sc, {1: [4]})
    # step 4: rank 1 shared zeros; the average over the one healthy rank is rank 0's
    # own gradient, which rank 0 can recompute from its buckets: avg(g0, 0) * 2 / 1 = g0
    for r0, r1 in zip(a.applied[4], b.applied[4]):
        assert torch.equal(r0, r1) and bool(torch.isfinite(r0).all())
    assert [s.metrics.get("diverged") for s in steps[1]][3:6] == [None, 1.0, None]
    assert "diverged" not in steps[0][4].metrics
    assert torch.equal(a.flat_params(), b.flat_params()) and bool(torch.isfinite(a.flat_params()).all())


def test_ddp_skip_step_applies_the_healthy_ranks_own_gradient():
    sc = _scenario("ddp", "training.on_divergence=skip")
    n = 2
    learners = [Poisoned(make_learner(sc, r, mode="numeric"), {1: [4]}.get(r, ())) for r in range(n)]
    packed = []
    inner = learners[0].inner.grad_buckets
    learners[0].inner.grad_buckets = lambda: packed.append(inner()) or packed[-1]
    run_programs([get_program("ddp")(AgentContext(r, n, sc, mode="numeric"), l) for r, l in enumerate(learners)])
    # step 4: avg(g0, zeros) x 2 healthy-rescaled = g0, rank 0's own gradient
    for got, g0 in zip(learners[1].applied[4], packed[4]):
        assert torch.allclose(got, g0, atol=1e-7)
    for got, g0 in zip(learners[1].applied[3], packed[3]):  # an ordinary step averages two
        assert not torch.allclose(got, g0, atol=1e-7)


@pytest.mark.parametrize("strategy", ["local_sgd", "diloco"])
def test_local_sgd_skip_restores_the_rank_and_averages_over_the_healthy_ones(strategy):
    sc = _scenario(strategy, "training.on_divergence=skip")
    steps, (a, b) = _run(sc, {1: [4]})  # the period of steps 3-5, averaged after step 5
    assert [s.metrics.get("diverged") for s in steps[1]][3:7] == [None, 1.0, 1.0, None]
    assert len(a.set_to) == len(b.set_to) == 3 and torch.equal(a.set_to[1], b.set_to[1])
    assert torch.equal(a.flat_params(), b.flat_params()) and bool(torch.isfinite(b.flat_params()).all())
    assert b.calls == 8  # rank 1 sat out step 5 (9 steps, one skipped)


def test_local_sgd_skip_average_is_rank_0s_parameters_alone():
    sc = _scenario("local_sgd", "training.on_divergence=skip")
    n = 2
    learners = [Poisoned(make_learner(sc, r, mode="numeric"), {1: [4]}.get(r, ())) for r in range(n)]
    seen = []
    inner = learners[0].inner.flat_params
    learners[0].inner.flat_params = lambda: seen.append(inner()) or seen[-1]
    run_programs([get_program("local_sgd")(AgentContext(r, n, sc, mode="numeric"), l) for r, l in enumerate(learners)])
    # the second average (after step 5): rank 0's packed parameters are the whole average
    assert torch.allclose(learners[1].set_to[1], seen[1], atol=1e-7)


def test_every_rank_diverging_at_once_stops_with_a_summary():
    for strategy in ("ddp", "local_sgd"):
        sc = _scenario(strategy, "training.on_divergence=skip")
        with pytest.raises(D.AllExcluded) as e:
            _run(sc, {0: [4], 1: [4]})
        msg = str(e.value)
        assert msg.startswith("every agent is excluded at step ") and "all 2 ranks" in msg and "training.lr=0.05" in msg


def test_cooperative_isolation_stays_and_all_excluded_stops_with_a_summary():
    sc = load_scenario(DIGITS, ["training.steps=12", "communication.interval=6"])
    steps, learners = _run(sc, {2: [2]}, what="grad")  # one agent's NaN gradient: isolated, the run goes on
    assert len(steps[0]) and all(bool(torch.isfinite(l.flat_params()).all()) for l in learners)
    with pytest.raises(D.AllExcluded) as e:
        _run(sc, {r: [2] for r in range(4)}, what="params")
    assert str(e.value).startswith("every agent is excluded at round 0: all 4 agents have a non-finite")


def test_cooperative_stop_names_rank_and_step():
    sc = load_scenario(DIGITS, ["training.steps=12", "communication.interval=6", "training.on_divergence=stop"])
    with pytest.raises(D.Diverged, match=r"^rank 3 diverged at step \d+: non-finite gradient"):
        _run(sc, {3: [2]})


@pytest.mark.parametrize("strategy", ["local_sgd", "single"])
def test_an_agent_alone_goes_on_from_its_last_good_state(strategy):
    sc = _scenario(strategy, "training.on_divergence=skip", n=1)
    steps, (a,) = _run(sc, {0: [4]})
    assert [s.metrics.get("diverged") for s in steps[0]] == [None] * 4 + [1.0] + [None] * 4
    assert a.calls == 9 and bool(torch.isfinite(a.flat_params()).all())


def test_a_real_divergence_in_the_simulator_is_one_line_and_exit_2(tmp_path, capsys):
    """cpu-tiny (gpt-tiny, numeric) with SGD (momentum 0.9) at lr 10 blows up for real: its
    gradients turn non-finite at step 4 on every rank; the simulator stops there."""
    from oresearcher.errors import cli_main
    from oresearcher.sim.__main__ import main

    base = ["cpu-tiny", "--mode", "numeric", "--set", "training.lr=10", "--set", "workload.optimizer=sgd",
            "--set", "training.steps=8", "--out", str(tmp_path)]
    assert cli_main(main, base) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: rank 0 diverged at step 4: non-finite gradient (training.lr=10)")
    assert cli_main(main, [*base, "--set", "training.on_divergence=skip"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: every agent is excluded at step 4: all 4 ranks had non-finite gradients")
    assert not (tmp_path / "report.json").exists()
