"""Fusion weights and the attention ensemble (oresearcher.cooperation.fusion)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher.cooperation.fusion import (HeterogeneousEnsemble, attention_scores, average_weights, fuse, fusion_weights,
                                group_weights, rbf_similarity)

score_mats = st.integers(1, 6).flatmap(
    lambda n: st.tuples(st.lists(st.floats(-3, 3, allow_nan=False), min_size=n * n, max_size=n * n),
                        st.lists(st.booleans(), min_size=n, max_size=n), st.just(n)))


@settings(max_examples=80, deadline=None)
@given(score_mats, st.floats(0.01, 10))
def test_weights_are_distributions_and_excluded_get_zero(data, tau):
    flat, ex, n = data
    w = fusion_weights(torch.tensor(flat).reshape(n, n), torch.tensor(ex), tau)
    assert torch.allclose(w.sum(1), torch.ones(n, dtype=torch.float64))
    assert bool((w >= 0).all())
    if not all(ex):
        assert bool((w[:, torch.tensor(ex)] == 0).all())
    else:  # nobody trustworthy: everyone keeps its own parameters
        assert torch.equal(w, torch.eye(n, dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.floats(-2, 2, allow_nan=False), st.floats(0.01, 5))
def test_uniform_score_gives_plain_averaging(n, c, tau):
    w = fusion_weights(torch.full((n, n), c), None, tau)
    assert torch.allclose(w, torch.full((n, n), 1.0 / n, dtype=torch.float64))
    theta = torch.randn(n, 7)
    assert torch.allclose(fuse(theta, w[0]), theta.mean(0), atol=1e-6)


def test_softmax_formula_by_hand():
    scores = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    w = fusion_weights(scores, None, 0.5)
    e = math.exp(2.0)
    assert w[0].tolist() == pytest.approx([e / (e + 1), 1 / (e + 1)])


def test_reliable_agents_pull_harder():
    theta = torch.zeros(3, 4)
    w = group_weights(theta, torch.tensor([0.9, 0.5, 0.1]), torch.zeros(3, dtype=torch.bool), temperature=0.1)
    assert bool((w[:, 0] > w[:, 1]).all() and (w[:, 1] > w[:, 2]).all())


def test_excluded_nan_agent_cannot_poison_the_fusion():
    theta = torch.tensor([[1.0, 2.0], [3.0, 4.0], [math.nan, math.inf]])
    ex = torch.tensor([False, False, True])
    w = group_weights(theta, torch.tensor([0.5, 0.5, math.nan]), ex, temperature=0.1)
    assert bool((w[:, 2] == 0).all())
    for i in range(3):
        out = fuse(theta, w[i])
        assert bool(torch.isfinite(out).all())
    # the healthy pair is symmetric: the flagged agent is healed to their plain mean
    assert fuse(theta, w[2]).tolist() == pytest.approx([2.0, 3.0])
    assert average_weights(3, ex)[0].tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_similarity_kernel():
    theta = torch.tensor([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]])
    s = rbf_similarity(theta)
    assert torch.allclose(s.diagonal(), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(s, s.T) and float(s[0, 1]) > float(s[0, 2])
    d2 = torch.tensor([1.0, 100.0, 81.0])
    sigma2 = float(d2.mean())  # mean of the off-diagonal squared distances
    assert float(s[0, 1]) == pytest.approx(math.exp(-1 / (2 * sigma2)))
    assert torch.equal(rbf_similarity(torch.ones(3, 2)), torch.ones(3, 3, dtype=torch.float64))
    # similarity makes an agent lean to itself when reliabilities are equal
    sc = attention_scores(torch.tensor([0.5, 0.5, 0.5]), s, 1.0)
    w = fusion_weights(sc, None, 0.1)
    assert int(w[2].argmax()) == 2


def test_plain_average_method():
    theta = torch.randn(4, 5)
    w = group_weights(theta, torch.rand(4), torch.zeros(4, dtype=torch.bool), method="average")
    assert torch.allclose(fuse(theta, w[1]), theta.mean(0), atol=1e-6)
    with pytest.raises(ValueError):
        group_weights(theta, torch.rand(4), torch.zeros(4, dtype=torch.bool), method="median")
    with pytest.raises(ValueError):
        fusion_weights(torch.zeros(2, 2), None, 0.0)


def test_heterogeneous_ensemble_starts_as_the_plain_mean():
    torch.manual_seed(0)
    outs = [torch.randn(5, 10), torch.randn(5, 10), torch.randn(5, 10)]
    ens = HeterogeneousEnsemble([10, 10, 10], 10, n_heads=2)
    with torch.no_grad():
        got = ens(outs)
    assert torch.allclose(got, torch.stack(outs).mean(0), atol=1e-5)


def test_heterogeneous_ensemble_mixes_widths_and_trains():
    torch.manual_seed(0)
    outs = [torch.randn(8, 3), torch.randn(8, 5)]
    ens = HeterogeneousEnsemble([3, 5], 4, n_heads=2)
    with torch.no_grad():  # narrower outputs are zero-padded, wider ones truncated
        want = (torch.nn.functional.pad(outs[0], (0, 1)) + outs[1][:, :4]) / 2
        assert torch.allclose(ens(outs), want, atol=1e-5)
    target = torch.randn(8, 4)
    opt = torch.optim.Adam(ens.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        loss = (ens(outs) - target).pow(2).mean()
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < first
    with pytest.raises(ValueError):
        ens(outs[:1])
    random_init = HeterogeneousEnsemble([3, 5], 4, n_heads=1, init="random")
    assert random_init(outs).shape == (8, 4)
