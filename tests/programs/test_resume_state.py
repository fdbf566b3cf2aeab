"""Exact resume through the programs' state protocol, in the reference interpreter.

A run snapshots every rank's learner and registered State objects at a resume boundary
(round-tripped through torch.save / torch.load(weights_only=True), as checkpoints are);
a second run from fresh learners loads them, starts at ``ctx.start_step`` and must end
with the same parameters and metrics, bit for bit, as the uninterrupted run.
"""
import io
from pathlib import Path

import pytest
import torch

from oresearcher import ops as O
from oresearcher.cooperation.allocation import AllocationState
from oresearcher.cooperation.outer import OuterNesterov
from oresearcher.programs import AgentContext, get_program
from oresearcher.programs.cooperative_exchange import GroupState, LoopState
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.tasks.supervised import ShuffledBatches
from oresearcher.testing import run_programs, tap

DIGITS = Path(__file__).resolve().parents[2] / "scenarios" / "digits-4.yaml"


def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _snapshotting(gen, ctx, learner, target, out):
    """Pass ``gen``'s ops through; at the StepDone marked ``target`` save the agent."""
    def on_op(op):
        if isinstance(op, O.StepDone):
            if ctx.boundary == target:
                out[ctx.rank] = roundtrip({"learner": learner.state_dict(),
                                           "states": {k: v.state_dict() for k, v in ctx.state.items()}})
            ctx.boundary = None
    return (yield from tap(gen, on_op))


def _run(sc, target=None, saved=None):
    n, prog = sc.world_size, get_program(sc.training.strategy)
    learners = [make_learner(sc, r, mode="numeric") for r in range(n)]
    start = 0 if saved is None else target + 1
    ctxs = [AgentContext(r, n, sc, mode="numeric", start_step=start,
                         restored=saved[r]["states"] if saved else {}) for r in range(n)]
    if saved:
        for r, l in enumerate(learners):
            l.load_state_dict(saved[r]["learner"])
    snaps = {}
    gens = [prog(c, l) for c, l in zip(ctxs, learners)]
    if target is not None and saved is None:
        gens = [_snapshotting(g, c, l, target, snaps) for g, c, l in zip(gens, ctxs, learners)]
    steps = run_programs(gens)
    return steps, learners, snaps


def _same_end(a, la, b, lb):
    for r in range(len(la)):
        assert torch.equal(la[r].flat_params(), lb[r].flat_params())
        assert a[r][-1].step == b[r][-1].step
        assert a[r][-1].metrics == b[r][-1].metrics


@pytest.mark.parametrize("overrides, target", [
    # cooperative: rounds of 4; boundary after round 1 (nominal step 7); SWA, dynamic roles,
    # allocation, gradient sharing through an error-feedback codec, outer Nesterov on fusion
    (["training.steps=12", "communication.interval=4", "communication.codec=ef(topk:0.1)",
      "cooperation.fusion.outer=nesterov"], 7),
    # diloco, resumed mid-period (H=4, after step 5): outer momentum, anchor, data position
    (["training.strategy=diloco", "training.steps=12", "training.local_steps=4",
      "workload.optimizer=sgd"], 5),
])
def test_resume_is_bit_identical(overrides, target):
    sc = load_scenario(DIGITS, overrides)
    full, lf, snaps = _run(sc, target)
    assert sorted(snaps) == list(range(sc.world_size))
    resumed, lr, _ = _run(sc, target, saved=snaps)
    assert resumed[0][0].step > 0  # it did start in the middle
    _same_end(full, lf, resumed, lr)
    # the registered state matters: the learners alone do not resume the same run
    bare = [{"learner": s["learner"], "states": {}} for s in snaps.values()]
    _, lb, _ = _run(sc, target, saved=bare)
    assert not all(torch.equal(x.flat_params(), y.flat_params()) for x, y in zip(lf, lb))


def test_state_objects_round_trip_through_weights_only():
    g = GroupState(["explorer", "validator"], [1.0, 1.2], [0.5], [[0.1, float("nan")]], 3)
    g2 = GroupState([], [])
    g2.load_state_dict(roundtrip(g.state_dict()))
    assert g2.state_dict()["roles"] == g.roles and g2.round == 3 and g2.lr_mult == g.lr_mult
    loop = LoopState(2, 17, [3, 5])
    loop2 = LoopState()
    loop2.load_state_dict(roundtrip(loop.state_dict()))
    assert loop2 == loop
    a = AllocationState(2, 0.1, 0.5)
    a.plan([0.3, 0.1], 10, [1, 2])
    a2 = AllocationState(2)
    a2.load_state_dict(roundtrip(a.state_dict()))
    assert a2.plan([0.5, 0.2], 10, [1, 2])[0] == a.plan([0.5, 0.2], 10, [1, 2])[0]
    o = OuterNesterov(0.7, 0.9)
    o.set_anchor(torch.ones(4))
    o.step(torch.zeros(4))
    o2 = OuterNesterov()
    o2.load_state_dict(roundtrip(o.state_dict()))
    assert torch.equal(o2.step(torch.full((4,), 0.5)), o.step(torch.full((4,), 0.5)))


def test_data_stream_resumes_mid_epoch():
    X, y = torch.arange(30.0).reshape(10, 3), torch.arange(10)
    a = ShuffledBatches(X, y, 3, seed=5)
    for _ in range(4):  # past an epoch boundary (3 batches per epoch)
        next(a)
    b = ShuffledBatches(X, y, 3, seed=99)
    b.load_state_dict(roundtrip(a.state_dict()))
    for _ in range(5):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_token_stream_resumes():
    from oresearcher.tasks.synthetic_lm import token_stream

    a = token_stream(64, 2, 8, seed=1, rank=0)
    next(a)
    b = token_stream(64, 2, 8, seed=1, rank=0)
    b.load_state_dict(roundtrip(a.state_dict()))
    assert torch.equal(next(a), next(b))
    assert not torch.equal(next(token_stream(64, 2, 8, seed=1, rank=0)), next(a))
