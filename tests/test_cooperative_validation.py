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

DIGITS = Path(__file__).resolve().parents[1] / "scenarios" / "digits-4.yaml"
SETS = ["training.steps=12", "communication.interval=6", "cooperation.roles.policy=static",
        "agents.roles={explorer: 1, optimizer: 1, validator: 2}", "cooperation.roles.optimizer_method=swa"]


@given(total=st.integers(0, 500), count=st.integers(1, 9))
def test_shards_are_disjoint_and_cover_the_split(total, count):
    rows = torch.cat([V.shard_rows(total, v, count) for v in range(count)])
    assert sorted(rows.tolist()) == list(range(total))


class _NoShards:
    """A learner without the predict hooks (as cartpole and finance)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name in ("task_data", "predict_params"):
            raise AttributeError(name)
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
