"""The digits task (oresearcher.tasks.digits)."""
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from oresearcher.errors import UserError
from oresearcher.scenario import Scenario
from oresearcher.tasks import make_learner
from oresearcher.tasks.rewards import shaped_loss
from oresearcher.tasks.digits import MODELS, build_model, load_splits
from oresearcher.tasks.supervised import expected_calibration_error


def _scenario(**workload):
    w = {"task": "digits", "model": "mlp", "global_batch": 32, "dtype": "fp32", **workload}
    return Scenario.model_validate({"workload": w, "agents": {"count": 2}, "cluster": {"gpus_per_node": 2},
                                    "training": {"lr": 3e-3, "steps": 10}})


def test_splits_are_fixed_disjoint_and_stratified():
    s = load_splits()
    sizes = {k: len(v[1]) for k, v in s.items()}
    assert sizes == {"train": 1078, "val": 359, "test": 360}  # 60 / 20 / 20 of 1797
    assert load_splits() is s  # loaded once per process, the same split for every seed
    for X, y in s.values():
        assert X.min() >= 0 and X.max() <= 1 and set(y.tolist()) == set(range(10))


def test_agents_are_clones_with_their_own_data_order():
    sc = _scenario()
    a, b = make_learner(sc, 0, mode="numeric"), make_learner(sc, 1, mode="numeric")
    assert torch.equal(a.flat_params(), b.flat_params())  # one base model
    xa, _ = next(a.batches)
    xb, _ = next(b.batches)
    assert xa.shape == (16, 64) and not torch.equal(xa, xb)


def test_flops_are_measured_by_torch():
    learner = make_learner(_scenario(), 0, mode="numeric")
    # a 64-64-10 MLP forward on 16 samples: 2 * 16 * (64*64 + 64*10) multiply-adds counted as FLOPs
    assert learner.fwd_flops == 2 * 16 * (64 * 64 + 64 * 10)
    with FlopCounterMode(display=False) as fc:
        learner.module(load_splits()["val"][0])
    assert learner.eval_flops == fc.get_total_flops()


def test_training_learns_and_evaluate_params_agrees_with_the_module():
    learner = make_learner(_scenario(), 0, mode="numeric")
    before = learner.evaluate()["test_loss"]
    for _ in range(60):
        learner.forward_backward()
        learner.optimizer_step()
    after = learner.evaluate()
    assert after["test_loss"] < before and after["metric"] == after["test_accuracy"]
    res = learner.evaluate_params(learner.flat_params(), "mlp")
    X, y = load_splits()["val"]
    with torch.no_grad():
        acc = float((learner.module(X).argmax(-1) == y).float().mean())
    assert res["metric"] == pytest.approx(acc)
    assert res["probs"].shape == (len(y), 10) and 0 <= res["calibration"] <= 1 and 0 <= res["safety"] <= 1


def test_other_architectures_and_nan_parameters():
    learner = make_learner(_scenario(), 0, mode="numeric")
    for arch in MODELS:
        n = learner.arch_numel(arch)
        assert n == sum(p.numel() for p in build_model(arch).parameters())
        res = learner.evaluate_params(torch.zeros(n + 5), arch)  # zero-padded gathers are fine
        assert res["metric"] == pytest.approx(0.1, abs=0.02)  # all-zero net: one class
    bad = learner.evaluate_params(torch.full((learner.numel,), float("nan")), "mlp")
    assert math.isnan(bad["loss"]) and bad["safety"] == 0.0


def test_calibration_error_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    labels = torch.tensor([0, 1, 0, 0])
    # bin (0.8, 0.9]: acc 0.5 conf 0.9; bin (0.5, 0.6]: acc 1.0 conf 0.6 -> 0.5*0.4 + 0.5*0.4
    assert expected_calibration_error(probs, labels) == pytest.approx(0.4)


def test_user_errors():
    # an unknown model is refused where the scenario is parsed, naming the known ones
    with pytest.raises(ValueError, match="unknown model for task digits; known: "):
        _scenario(model="gpt-1.3b")
    with pytest.raises(UserError, match="numeric or real"):
        make_learner(_scenario(), 0, mode="shape")


def _fwd_flops(arch, x):
    with FlopCounterMode(display=False) as fc:
        build_model(arch)(x)
    return fc.get_total_flops()


def test_shaped_loss_uses_the_frozen_peers_and_charges_their_passes():
    sc = _scenario()
    learner = make_learner(sc, 0, mode="numeric")
    base = learner.fwd_flops
    x, y = load_splits()["train"][0][:16], load_splits()["train"][1][:16]
    ce = torch.nn.functional.cross_entropy(learner.module(x), y).detach()
    learner.set_reward_weights((0.5, 0.3, 0.2))
    assert torch.equal(learner.loss_fn(learner.module, (x, y)).detach(), ce)  # no snapshot yet: plain CE
    torch.manual_seed(5)
    peers = [build_model("mlp"), build_model("cnn")]
    flats = [torch.nn.utils.parameters_to_vector(m.parameters()).detach() for m in peers]
    learner.set_peers([("mlp", flats[0]), ("cnn", torch.cat([flats[1], torch.zeros(7)])),  # zero-padded gather
                       ("mlp", torch.full_like(flats[0], float("nan")))])  # a diverged peer is dropped
    assert [a for a, _ in learner.peers] == ["mlp", "cnn"]
    assert learner.fwd_flops == base + _fwd_flops("mlp", x) + _fwd_flops("cnn", x)
    with torch.no_grad():
        p_bar = (peers[0](x).softmax(-1) + peers[1](x).softmax(-1)) / 2
    got = learner.loss_fn(learner.module, (x, y)).detach()
    assert float(got) == pytest.approx(float(shaped_loss(learner.module(x), y, p_bar, (0.5, 0.3, 0.2)).detach()), rel=1e-6)
    assert float(got) != pytest.approx(float(ce))
    # the snapshot is part of the learner's checkpoint
    other = make_learner(sc, 0, mode="numeric")
    other.load_state_dict(learner.state_dict())
    other.set_reward_weights((0.5, 0.3, 0.2))
    assert other.fwd_flops == learner.fwd_flops
    assert torch.equal(other.loss_fn(other.module, (x, y)).detach(), got)
    learner.set_peers([])
    assert learner.fwd_flops == base and torch.equal(learner.loss_fn(learner.module, (x, y)).detach(), ce)
