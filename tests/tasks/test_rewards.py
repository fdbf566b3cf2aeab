"""Reward terms and the reward-weight schedule (oresearcher.tasks.rewards)."""
import math

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from oresearcher.tasks.rewards import (SAFETY_RULES, centre_band_safety, count_novelty, finite_safety, loss_coefficients,
                                 overconfident_error_safety, ramp, register_safety_rule, reward, scheduled_weights,
                                 shaped_loss, soft_overconfident_error, tv_novelty)

weights = st.tuples(*(st.floats(0, 1, allow_nan=False) for _ in range(3))).filter(lambda w: sum(w) > 1e-3)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_schedule_endpoints(schedule):
    w = (0.5, 0.3, 0.2)
    b0, n0, s0 = scheduled_weights(w, 0.0, schedule, 0.5)
    b1, n1, s1 = scheduled_weights(w, 1.0, schedule, 0.5)
    assert n0 == pytest.approx(0.45) and n1 == pytest.approx(0.15)  # 0.3 * (1 +- 0.5)
    # what novelty gives up goes to base and safety in proportion 0.5 : 0.2
    assert b1 == pytest.approx(0.5 + 0.15 * 5 / 7) and s1 == pytest.approx(0.2 + 0.15 * 2 / 7)
    assert b0 == pytest.approx(0.5 - 0.15 * 5 / 7) and s0 == pytest.approx(0.2 - 0.15 * 2 / 7)
    mid = scheduled_weights(w, 0.5, schedule, 0.5)
    assert mid == pytest.approx(w)  # both ramps pass through 1/2 at mid-training


def test_constant_schedule_and_zero_boost_leave_weights_alone():
    assert scheduled_weights((0.5, 0.3, 0.2), 0.1, "constant", 0.9) == pytest.approx((0.5, 0.3, 0.2))
    assert scheduled_weights((0.5, 0.3, 0.2), 0.9, "cosine", 0.0) == pytest.approx((0.5, 0.3, 0.2))


def test_cosine_is_slower_than_linear_early():
    assert ramp(0.1, "cosine") < ramp(0.1, "linear")
    assert ramp(0.9, "cosine") > ramp(0.9, "linear")
    with pytest.raises(ValueError):
        ramp(0.5, "exponential")


@settings(max_examples=60, deadline=None)
@given(weights, st.floats(0, 1), st.floats(0, 1), st.sampled_from(["linear", "cosine", "constant"]))
def test_schedule_keeps_sum_and_signs(w, p, b, schedule):
    out = scheduled_weights(w, p, schedule, b)
    assert sum(out) == pytest.approx(sum(w), abs=1e-9)
    assert all(x >= -1e-12 for x in out)


@settings(max_examples=40, deadline=None)
@given(weights, st.floats(0, 1), st.floats(0, 1), st.sampled_from(["linear", "cosine"]))
def test_novelty_weight_never_rises_over_training(w, p, q, schedule):
    lo, hi = sorted((p, q))
    assert scheduled_weights(w, hi, schedule)[1] <= scheduled_weights(w, lo, schedule)[1] + 1e-12


def test_reward_is_the_weighted_sum():
    t, n, s = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    assert reward(t, n, s, (0.5, 0.3, 0.2)).tolist() == pytest.approx([0.6, 0.4])


def test_novelty_terms():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    assert float(tv_novelty(p, p)) == 0.0
    assert float(tv_novelty(p, torch.tensor([[0.0, 1.0], [0.5, 0.5]]))) == pytest.approx(0.5)
    assert count_novelty(torch.tensor([0, 3])).tolist() == pytest.approx([1.0, 0.5])


def test_safety_rules():
    probs = torch.tensor([[0.95, 0.05], [0.6, 0.4], [0.05, 0.95], [0.99, 0.01]])
    labels = torch.tensor([1, 1, 1, 0])  # one confident error, one unsure error
    assert overconfident_error_safety(probs, labels) == pytest.approx(0.75)
    assert centre_band_safety(torch.tensor([0.0, 1.0, -2.0, 1.3])) == pytest.approx(0.5)
    assert finite_safety(torch.tensor([1.0, math.inf])) == 0.0 and finite_safety(torch.ones(2)) == 1.0
    register_safety_rule("test-always", lambda **_: 1.0)
    assert SAFETY_RULES["test-always"]() == 1.0
    with pytest.raises(ValueError):
        register_safety_rule("finite", finite_safety)


# ---- the reward-shaped supervised loss ---------------------------------------------------

def test_shaped_loss_by_hand():
    logits = torch.tensor([[0.0, 5.0, 0.0], [2.0, 0.0, 0.0]])
    labels = torch.tensor([0, 0])
    peers = torch.tensor([[0.8, 0.1, 0.1], [0.2, 0.5, 0.3]])
    e5, e2 = math.exp(5.0), math.exp(2.0)
    p = [[1 / (2 + e5), e5 / (2 + e5), 1 / (2 + e5)], [e2 / (e2 + 2), 1 / (e2 + 2), 1 / (e2 + 2)]]
    ce = (-math.log(p[0][0]) - math.log(p[1][0])) / 2
    tv = sum(0.5 * sum(abs(a - b) for a, b in zip(pi, qi)) for pi, qi in zip(p, peers.tolist())) / 2
    unsafe = ((p[0][1] - 0.9) / 0.1 + 0.0) / 2  # sample 0 is confidently wrong (class 1), sample 1 is right
    # weights (0.5, 0.3, 0.2): lambdas 0.3/0.5 and 0.2/0.5
    want = ce - 0.6 * tv + 0.4 * unsafe
    assert loss_coefficients((0.5, 0.3, 0.2)) == pytest.approx((0.6, 0.4))
    assert float(shaped_loss(logits, labels, peers, (0.5, 0.3, 0.2))) == pytest.approx(want, rel=1e-6)
    assert float(soft_overconfident_error(logits.softmax(-1), labels)) == pytest.approx(unsafe, rel=1e-6)


def test_shaped_loss_is_cross_entropy_without_shaping_terms():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(8, 10, generator=g), torch.randint(10, (8,), generator=g)
    peers = torch.randn(8, 10, generator=g).softmax(-1)
    ce = torch.nn.functional.cross_entropy(logits, labels)
    assert torch.equal(shaped_loss(logits, labels, peers, (0.7, 0.0, 0.0)), ce)
    assert torch.equal(shaped_loss(logits, labels, None, (0.5, 0.3, 0.2)), ce)  # no peer snapshot yet
    assert torch.equal(shaped_loss(logits, labels, peers, None), ce)
    assert not torch.equal(shaped_loss(logits, labels, peers, (0.5, 0.3, 0.0)), ce)


@given(w=weights)
@settings(max_examples=50, deadline=None)
def test_loss_coefficients_keep_the_task_term_dominant(w):
    lam_n, lam_s = loss_coefficients(w)
    assert 0.0 <= lam_n <= 1.0 and 0.0 <= lam_s <= 1.0
    assert (lam_n == 0.0) == (w[1] == 0.0) and (lam_s == 0.0) == (w[2] == 0.0)
    if w[0] > 0 and w[1] <= w[0]:
        assert lam_n == pytest.approx(w[1] / w[0])


def test_soft_safety_is_positive_exactly_where_the_rule_says_unsafe():
    probs = torch.tensor([[0.95, 0.05], [0.6, 0.4], [0.05, 0.95], [0.99, 0.01]])
    labels = torch.tensor([1, 1, 1, 0])
    per_sample = [float(soft_overconfident_error(probs[i:i + 1], labels[i:i + 1])) for i in range(4)]
    assert [x > 0 for x in per_sample] == [True, False, False, False]
    assert 1.0 - overconfident_error_safety(probs, labels) == pytest.approx(sum(x > 0 for x in per_sample) / 4)
    assert all(0.0 <= x <= 1.0 for x in per_sample)


def _step(z, labels, peers, w, eta):
    z = z.clone().requires_grad_(True)
    shaped_loss(z, labels, peers, w).backward()
    return (z - eta * z.grad).detach()


@given(seed=st.integers(0, 10**6), w_nov=st.floats(0.05, 1.0))
@settings(max_examples=40, deadline=None)
def test_novelty_gradient_pushes_away_from_the_peer_ensemble(seed, w_nov):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(4, 5, generator=g, dtype=torch.float64)
    labels = torch.randint(5, (4,), generator=g)
    peers = torch.randn(4, 5, generator=g, dtype=torch.float64).softmax(-1)
    # away from the kinks of |p - p_bar| (a step of 1e-4 cannot cross one)
    assume(float((z.softmax(-1) - peers).abs().min()) > 1e-2)
    tv = lambda x: float(tv_novelty(x.softmax(-1), peers))  # noqa: E731
    plain = _step(z, labels, peers, (1.0, 0.0, 0.0), 1e-4)
    shaped = _step(z, labels, peers, (1.0, w_nov, 0.0), 1e-4)
    assert tv(shaped) >= tv(plain) - 1e-9


def test_novelty_weight_keeps_the_agent_further_from_its_peers_in_training():
    g = torch.Generator().manual_seed(1)
    z0, labels = torch.randn(16, 10, generator=g), torch.randint(10, (16,), generator=g)
    peers = torch.randn(16, 10, generator=g).softmax(-1)
    z_ce, z_sh = z0.clone(), z0.clone()
    for _ in range(50):
        z_ce, z_sh = _step(z_ce, labels, peers, (1.0, 0.0, 0.0), 0.5), _step(z_sh, labels, peers, (0.5, 0.5, 0.0), 0.5)
    assert float(tv_novelty(z_sh.softmax(-1), peers)) > float(tv_novelty(z_ce.softmax(-1), peers)) + 1e-3


# ---- the agreement (co-distillation) peer term ---------------------------------------------

@given(seed=st.integers(0, 10**6), lam=st.floats(0.05, 2.0))
@settings(max_examples=40, deadline=None)
def test_agreement_gradient_points_toward_the_peer_mean(seed, lam):
    from oresearcher.tasks.rewards import agreement_loss

    g = torch.Generator().manual_seed(seed)
    z = torch.randn(4, 5, generator=g, dtype=torch.float64)
    labels = torch.randint(5, (4,), generator=g)
    peers = torch.randn(4, 5, generator=g, dtype=torch.float64).softmax(-1)
    zz = z.clone().requires_grad_(True)
    agreement_loss(zz, peers).backward()
    assert torch.allclose(zz.grad, (z.softmax(-1) - peers) / 4, atol=1e-6)  # (p - p_bar) / B, by hand
    # the shaped loss's peer part: its gradient is lam x that, and a small step lowers TV to the peers
    peer_part = lambda w: _step_term(z, labels, peers, w)  # noqa: E731
    grad = peer_part(lam) - peer_part(0.0)
    assert torch.allclose(grad, lam * (z.softmax(-1) - peers) / 4, atol=1e-5)
    tv = lambda x: float(tv_novelty(x.softmax(-1), peers))  # noqa: E731
    assert tv(z - 1e-3 * grad) < tv(z)


def _step_term(z, labels, peers, lam):
    z = z.clone().requires_grad_(True)
    shaped_loss(z, labels, peers, (1.0, 0.3, 0.0), "agreement", lam).backward()
    return z.grad.detach()


def test_peer_terms_by_name():
    g = torch.Generator().manual_seed(2)
    logits, labels = torch.randn(8, 10, generator=g), torch.randint(10, (8,), generator=g)
    peers = torch.randn(8, 10, generator=g).softmax(-1)
    ce = torch.nn.functional.cross_entropy(logits, labels)
    w = (0.5, 0.3, 0.0)
    assert torch.equal(shaped_loss(logits, labels, peers, w, "none", 1.0), ce)
    assert torch.equal(shaped_loss(logits, labels, peers, w, "agreement", 0.0), ce)  # the novelty weight is not used
    kl = float((peers * (peers.log() - logits.log_softmax(-1))).sum(-1).mean())
    assert float(shaped_loss(logits, labels, peers, w, "agreement", 0.5)) == pytest.approx(float(ce) + 0.5 * kl,
                                                                                           rel=1e-5)
    with pytest.raises(ValueError, match="unknown peer term"):
        shaped_loss(logits, labels, peers, w, "repel", 1.0)


def test_agreement_weight_ramps_up_to_its_value():
    from oresearcher.tasks.rewards import agreement_weight

    assert agreement_weight(0.5, 0.0, "cosine") == 0.0
    assert agreement_weight(0.5, 1.0, "cosine") == pytest.approx(0.5)
    assert agreement_weight(0.5, 0.5, "linear") == pytest.approx(0.25)
    assert agreement_weight(0.5, 0.9, "constant") == pytest.approx(0.25)
