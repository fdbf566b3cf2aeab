"""The cartpole DQN task (oresearcher.tasks.cartpole)."""
import math

import pytest
import torch

from oresearcher.errors import UserError
from oresearcher.tasks.rewards import count_novelty
from oresearcher.scenario import Scenario
from oresearcher.tasks import make_learner
from oresearcher.tasks.cartpole import GAMMA, SAFE_BAND, Replay, greedy_episode, state_bin


def _scenario(n=2, **workload):
    w = {"task": "cartpole", "model": "mlp", "global_batch": 32, "dtype": "fp32", **workload}
    return Scenario.model_validate({"workload": w, "agents": {"count": n}, "cluster": {"gpus_per_node": 4},
                                    "training": {"lr": 1e-3, "steps": 50}})


def test_equal_samples_per_step_whatever_the_group_size():
    one = make_learner(_scenario(1), 0, mode="numeric")
    four = [make_learner(_scenario(4), r, mode="numeric") for r in range(4)]
    assert one.batches.env_steps == 4 and all(l.batches.env_steps == 1 for l in four)
    assert one.batches.batch == 32 and all(l.batches.batch == 8 for l in four)
    assert torch.equal(four[0].flat_params(), four[3].flat_params())  # clones of one base model


def test_a_step_collects_replays_and_updates_the_target():
    learner = make_learner(_scenario(), 0, mode="numeric")
    out = learner.forward_backward()
    assert math.isfinite(out["loss"]) and learner.batches.replay.n >= 16
    assert all(p.grad is not None for p in learner.params)
    learner.optimizer_step()
    for _ in range(3):
        learner.forward_backward()
    # first step: 2 env steps, then a warm-up to one batch (16); then 2 per step
    assert learner.batches.collected == 16 + 3 * 2
    # the target network was copied at update 0 and is now behind the online network
    assert not torch.equal(torch.nn.utils.parameters_to_vector(learner.target.parameters()), learner.flat_params())


def test_td_loss_by_hand():
    learner = make_learner(_scenario(), 0, mode="numeric")
    s, s2 = torch.randn(5, 4), torch.randn(5, 4)
    a, r, d = torch.tensor([0, 1, 0, 1, 1]), torch.ones(5), torch.tensor([0.0, 0, 1, 0, 0])
    with torch.no_grad():
        q = learner.module(s).gather(1, a.unsqueeze(1)).squeeze(1)
        y = r + GAMMA * (1 - d) * learner.target(s2).max(1).values
    want = torch.nn.functional.smooth_l1_loss(q, y)
    assert float(learner.loss_fn(learner.module, (s, a, r, s2, d)).detach()) == pytest.approx(float(want))


def test_shaped_reward_follows_the_weights():
    learner = make_learner(_scenario(), 0, mode="numeric")
    learner.set_reward_weights((0.5, 0.3, 0.2))
    stream = learner.batches
    s2 = torch.tensor([0.5, 0.0, 0.0, 0.0])  # inside the safe band, first visit
    assert stream._shaped(s2, 1.0) == pytest.approx(0.5 + 0.3 * 1.0 + 0.2)
    assert stream._shaped(s2, 1.0) == pytest.approx(0.5 + 0.3 * float(count_novelty(torch.tensor(1))) + 0.2)
    outside = torch.tensor([SAFE_BAND + 0.5, 0.0, 0.0, 0.0])
    assert stream._shaped(outside, 1.0) == pytest.approx(0.5 + 0.3 + 0.0)
    learner.set_reward_weights(None)
    assert stream._shaped(outside, 1.0) == 1.0
    assert state_bin(s2) != state_bin(outside)


def test_replay_ring_buffer_wraps():
    rb = Replay(3)
    for i in range(5):
        rb.add(torch.full((4,), float(i)), i % 2, 1.0, torch.zeros(4), 0.0)
    assert rb.n == 3 and sorted(rb.s[:, 0].tolist()) == [2.0, 3.0, 4.0]
    s, *_ = rb.sample(10, torch.Generator().manual_seed(0))
    assert s.shape == (10, 4)


def test_evaluation_is_deterministic_and_validator_scores_are_bounded():
    learner = make_learner(_scenario(), 0, mode="numeric")
    assert learner.evaluate() == learner.evaluate()
    ret, xs, q0 = greedy_episode(learner.module, 123)
    assert 1 <= ret <= 500 and len(xs) == int(ret)
    res = learner.evaluate_params(learner.flat_params(), "mlp")
    assert 0 < res["metric"] <= 1 and 0 <= res["safety"] <= 1 and math.isfinite(res["loss"])
    assert res["probs"].shape == (256, 2) and res["flops"] > 0
    small = learner.evaluate_params(torch.zeros(learner.arch_numel("mlp-small")), "mlp-small")
    assert math.isfinite(small["metric"])
    bad = learner.evaluate_params(torch.full((learner.numel,), float("inf")), "mlp")
    assert math.isnan(bad["metric"])


def test_explorer_epsilon_scale():
    learner = make_learner(_scenario(), 0, mode="numeric")
    learner.batches.collected = 10**6  # far past the decay: epsilon at its floor
    base = learner.batches.epsilon()
    learner.set_exploration(3.0)
    assert learner.batches.epsilon() == pytest.approx(3 * base)


def test_user_errors():
    # an unknown model is refused where the scenario is parsed, naming the known ones
    with pytest.raises(ValueError, match="unknown model for task cartpole; known: mlp"):
        _scenario(model="cnn")
    with pytest.raises(UserError, match="numeric or real"):
        make_learner(_scenario(), 0, mode="shape")
