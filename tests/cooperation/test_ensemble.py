"""The trained attention ensemble (oresearcher.cooperation.ensemble).

A constructed case where agents differ in quality (one informative agent, three that
guess): fitted on one held-out set, the ensemble beats the plain mean on another. Its
state resumes exactly, alone and inside the cooperative program.
"""
import io
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from oresearcher import ops as O
from oresearcher.cooperation.ensemble import EnsembleState, as_inputs, loo_novelty
from oresearcher.programs import AgentContext, get_program
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.testing import run_programs, tap

HETERO = Path(__file__).resolve().parents[2] / "scenarios" / "digits-hetero.yaml"
C = 10


def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def agents_of_mixed_quality(n: int, g: torch.Generator):
    """Agent 0 sees the label (3 logits of signal over unit noise); agents 1-3 guess."""
    y = torch.randint(C, (n,), generator=g)
    good = (3 * F.one_hot(y, C).float() + torch.randn(n, C, generator=g)).softmax(-1)
    guessers = [(2 * torch.randn(n, C, generator=g)).softmax(-1) for _ in range(3)]
    return [good] + guessers, y


def test_untrained_is_the_plain_mean_and_masks_agents():
    g = torch.Generator().manual_seed(0)
    probs, _ = agents_of_mixed_quality(50, g)
    ens = EnsembleState(4, C)
    mean = torch.stack([as_inputs(p) for p in probs]).mean(0)
    assert torch.allclose(ens.predict(probs), mean, atol=1e-5)
    broken = [probs[0], torch.full_like(probs[1], float("nan")), probs[2], None]
    out = ens.predict(broken)  # the NaN agent and the missing one are left out
    assert torch.allclose(out, (as_inputs(probs[0]) + as_inputs(probs[2])) / 2, atol=1e-5)


def test_trained_beats_the_plain_mean_where_agents_differ_in_quality():
    g = torch.Generator().manual_seed(1)
    fit_probs, fit_y = agents_of_mixed_quality(360, g)  # the validation split's size
    test_probs, test_y = agents_of_mixed_quality(1000, g)
    ens = EnsembleState(4, C, d_model=16, n_heads=8, epochs=50, lr=0.03)
    plain = ens.predict(test_probs)
    info = ens.fit(fit_probs, fit_y)
    trained = ens.predict(test_probs)
    acc = lambda logits: float((logits.argmax(-1) == test_y).float().mean())  # noqa: E731
    print(f"test accuracy: plain mean {acc(plain):.3f}, trained {acc(trained):.3f}; "
          f"CE {float(F.cross_entropy(plain, test_y)):.3f} -> {float(F.cross_entropy(trained, test_y)):.3f}")
    assert info["ensemble_heldout_loss"] < info["mean_heldout_loss"]
    assert acc(trained) > acc(plain) + 0.3
    assert ens.model.attn.in_proj_weight[:32].abs().sum() > 0  # queries and keys trained: not a plain mean
    assert float(F.cross_entropy(trained, test_y)) < float(F.cross_entropy(plain, test_y)) - 0.5
    # leave-one-out novelty: the informative agent is the one the others' ensemble misses most
    nov = loo_novelty(ens, test_probs)
    assert all(0.0 <= v <= 1.0 for v in nov)


def test_fit_resumes_exactly():
    g = torch.Generator().manual_seed(2)
    rounds = [agents_of_mixed_quality(90, g) for _ in range(2)]
    a = EnsembleState(4, C, epochs=15, seed=3)
    a.fit(*rounds[0])
    b = EnsembleState(4, C, epochs=15, seed=3)
    b.load_state_dict(roundtrip(a.state_dict()))
    a.fit(*rounds[1])
    b.fit(*rounds[1])
    for (k, va), vb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(va, vb), k
    assert a.fits == b.fits == 2


def _program_run(sc, target=None, saved=None):
    """The cooperative program in the reference interpreter; snapshots every rank at ``target``."""
    n, prog = sc.world_size, get_program("oresearcher")
    learners = [make_learner(sc, r, mode="numeric") for r in range(n)]
    ctxs = [AgentContext(r, n, sc, mode="numeric", start_step=0 if saved is None else target + 1,
                         restored=saved[r]["states"] if saved else {}) for r in range(n)]
    for r, l in enumerate(learners):
        if saved:
            l.load_state_dict(saved[r]["learner"])
    snaps = {}

    def snap(ctx, learner, gen):
        def on_op(op):
            if isinstance(op, O.StepDone):
                if ctx.boundary == target and saved is None:
                    snaps[ctx.rank] = roundtrip({"learner": learner.state_dict(),
                                                 "states": {k: v.state_dict() for k, v in ctx.state.items()}})
                ctx.boundary = None
        return (yield from tap(gen, on_op))
    steps = run_programs([snap(c, l, prog(c, l)) for c, l in zip(ctxs, learners)])
    return steps, learners, snaps, ctxs


def test_program_checkpoints_the_ensemble_and_resumes_bit_identically():
    sc = load_scenario(HETERO, ["training.steps=8", "communication.interval=4", "cooperation.ensemble.epochs=8",
                                     "distill.student=null"])
    full, lf, snaps, ctxs = _program_run(sc, target=3)
    assert all("ensemble" in s["states"] for s in snaps.values())
    resumed, lr, _, ctxs2 = _program_run(sc, target=3, saved=snaps)
    assert resumed[0][0].step > 0
    for r in range(4):
        assert torch.equal(lf[r].flat_params(), lr[r].flat_params())
        assert full[r][-1].metrics == resumed[r][-1].metrics
        for va, vb in zip(ctxs[r].state["ensemble"].model.state_dict().values(),
                          ctxs2[r].state["ensemble"].model.state_dict().values()):
            assert torch.equal(va, vb)
    # every rank fitted the same ensemble from the same gathered numbers
    ref = ctxs[0].state["ensemble"].model.state_dict()
    assert all(torch.equal(ref[k], c.state["ensemble"].model.state_dict()[k]) for c in ctxs[1:] for k in ref)


def test_heads_must_divide_the_width_one_line():
    from oresearcher.errors import UserError

    with pytest.raises(UserError) as e:
        load_scenario(HETERO, ["cooperation.ensemble.d_model=12"])
    assert "\n" not in str(e.value) and "multiple of heads" in str(e.value)
