"""A distillation phase interrupted and resumed gives the same student, and the shared
replay pool feeds the student (oresearcher.cooperation.distill).

In the reference interpreter, as tests/programs/test_resume_state.py does for training: the
uninterrupted run snapshots every rank (learner, registered states, global RNG; through
torch.save / torch.load(weights_only=True), as checkpoints are) at the last resume
boundary, the end of cooperative training, which is where a run stopped during
distillation resumes. A second run from fresh learners loads the snapshot and must end
with the same student, bit for bit, and the same reported figures.
"""
import io
from pathlib import Path

import pytest
import torch

from oresearcher import ops as O
from oresearcher.cooperation import distill as D
from oresearcher.programs import AgentContext, get_program
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.testing import run_programs, tap

HETERO = Path(__file__).resolve().parents[2] / "scenarios" / "digits-hetero.yaml"
SMALL = ["training.steps=8", "communication.interval=4", "cooperation.ensemble.epochs=5", "distill.steps=12"]
REPLAY = ["cooperation.replay.enabled=true", "cooperation.replay.sync_every=2"]


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _run(sc, saved=None):
    """(StepDones per rank, learners, snapshots at the end of cooperative training)."""
    n, last = sc.world_size, sc.training.steps - 1
    learners = [make_learner(sc, r, mode="numeric") for r in range(n)]
    ctxs = [AgentContext(r, n, sc, mode="numeric", start_step=last + 1 if saved else 0,
                         restored=saved[r]["states"] if saved else {}) for r in range(n)]
    if saved:
        for r, learner in enumerate(learners):
            learner.load_state_dict(saved[r]["learner"])
        torch.set_rng_state(saved[0]["rng"])
    snaps = {}

    def snapshotting(gen, ctx, learner):
        def on_op(op):
            if isinstance(op, O.StepDone):
                if ctx.boundary == last:
                    snaps[ctx.rank] = _roundtrip({"learner": learner.state_dict(), "rng": torch.get_rng_state(),
                                                  "states": {k: v.state_dict() for k, v in ctx.state.items()}})
                ctx.boundary = None
        return (yield from tap(gen, on_op))
    prog = get_program("oresearcher")
    steps = run_programs([snapshotting(prog(c, l), c, l) for c, l in zip(ctxs, learners)])
    return steps, learners, snaps


@pytest.mark.parametrize("extra", [[], REPLAY], ids=["plain", "replay-pool"])
def test_interrupted_distillation_resumes_to_the_same_student(extra):
    sc = load_scenario(HETERO, SMALL + extra)
    full, lf, snaps = _run(sc)
    assert sorted(snaps) == list(range(sc.world_size))  # every rank reached the boundary
    assert snaps[0]["states"]["distill_final"]["pad_to"] > 0  # the final agents travel with it
    resumed, lr, _ = _run(sc, saved=snaps)
    assert resumed[0][0].step == sc.training.steps  # it started after training, in the phase
    assert len(resumed[0]) == sc.distill.steps
    for a, b in zip(lf, lr):
        sa, sb = a.distill_result["module"], b.distill_result["module"]
        for p, q in zip(sa.parameters(), sb.parameters()):
            assert torch.equal(p, q)
    ma, mb = full[0][-1].metrics, resumed[0][-1].metrics
    for k in ("student_test_accuracy", "ensemble_test_accuracy", "best_agent_test_accuracy", "cluster_flops",
              "distill_loss"):
        assert ma[k] == mb[k], k  # cluster_flops too: the FLOPs before the boundary are restored
    if not extra:  # the check can fail: without the saved final agents no student comes out
        for snap in snaps.values():
            del snap["states"]["distill_final"]
        _, bare, _ = _run(sc, saved=snaps)
        assert bare[0].distill_result is None


def test_the_replay_pool_feeds_the_student():
    sc = load_scenario(HETERO, SMALL + REPLAY + ["training.steps=4", "distill.steps=1"])
    learners = [make_learner(sc, r, mode="numeric") for r in range(sc.world_size)]
    ctxs = [AgentContext(r, sc.world_size, sc, mode="numeric") for r in range(sc.world_size)]
    seen = []
    real = D.Student.__init__

    def spy(self, *a, **kw):
        real(self, *a, **kw)
        seen.append(self)
    D.Student.__init__ = spy
    try:
        run_programs([get_program("oresearcher")(c, l) for c, l in zip(ctxs, learners)])
    finally:
        D.Student.__init__ = real
    assert len(seen) == sc.world_size
    for st in seen:
        Xp, yp, tp, w, k = st.pool
        assert k == round(learners[0].hard_fraction * st.batch) > 0
        assert len(Xp) == len(yp) == len(tp) == len(w) > 0 and tp.shape[1] == 10
        x, y, t = st.draw()
        assert len(x) == st.batch
        # the last k rows are pool rows, with the pool's own teacher outputs
        for row, label, logit in zip(x[-k:], y[-k:], t[-k:]):
            j = int(((Xp == row).all(1) & (yp == label)).nonzero()[0])
            assert torch.equal(tp[j], logit)


def test_replay_rows_share_and_weights():
    from oresearcher.cooperation.replay import PrioritizedReplay

    pool = PrioritizedReplay(8, alpha=1.0)
    pool.add({"x": torch.arange(10.0).reshape(5, 2), "y": torch.arange(5)}, priorities=[1, 2, 3, 4, 5])
    shared = type("S", (), {"pool": pool})()
    X = torch.zeros(3, 2)
    x, y, w = D.replay_rows(shared, 1, 2, X)
    assert y.tolist() == [1, 3] and x.tolist() == [[2.0, 3.0], [6.0, 7.0]]
    assert w.tolist() == pytest.approx([2.0, 4.0], rel=1e-5)  # (p + eps)^alpha, alpha 1
    assert D.replay_rows(None, 0, 2, X) is None
    assert D.replay_rows(shared, 7, 8, X) is None  # an empty share
    rl = PrioritizedReplay(4)
    rl.add({"s": torch.zeros(2, 4), "a": torch.zeros(2)})
    assert D.replay_rows(type("S", (), {"pool": rl})(), 0, 1, X) is None  # transitions, not samples
