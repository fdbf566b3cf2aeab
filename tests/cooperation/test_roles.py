"""Role policies, validator reports and dynamic assignment (oresearcher.cooperation.roles)."""
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from oresearcher.cooperation import roles as R
from oresearcher.models.learner import TorchLearner


def test_initial_roles_follow_the_mix_and_always_have_a_validator():
    mix = SimpleNamespace(explorer=1, optimizer=2, validator=1)
    assert R.initial_roles(4, mix) == ["explorer", "optimizer", "optimizer", "validator"]
    assert R.initial_roles(4, None) == ["explorer", "explorer", "optimizer", "validator"]
    no_val = SimpleNamespace(explorer=2, optimizer=1, validator=0)
    assert R.initial_roles(3, no_val) == ["explorer", "explorer", "validator"]
    assert R.initial_roles(3, mix, policy="plain") == ["validator"] * 3
    assert R.initial_roles(1, None) == ["validator"]


def test_plateau_degree():
    assert R.plateau_degree([1.0, 0.5], 2, 0.01) == 0.0  # too short to judge
    assert R.plateau_degree([1.0, 0.9, 0.5, 0.4], 2, 0.01) == 0.0  # improving fast
    assert R.plateau_degree([1.0, 0.5, 0.5, 0.5], 2, 0.01) == 1.0  # flat
    assert R.plateau_degree([1.0, 0.5, 0.499, 0.4975], 2, 0.01) == pytest.approx(0.5)


def test_difficulty_mixes_plateau_and_spread():
    ex = torch.zeros(4, dtype=torch.bool)
    d, p, s = R.difficulty([1.0, 0.5, 0.5, 0.5], torch.tensor([0.5, 0.5, 0.5, 0.5]), ex, 2, 0.01)
    assert (d, p, s) == (0.5, 1.0, 0.0)
    d2, _, s2 = R.difficulty([1.0, 0.5, 0.5, 0.5], torch.tensor([0.1, 0.9, 0.5, 0.5]), ex, 2, 0.01)
    assert s2 > 0 and d2 > d


def test_harder_means_more_explorers_and_one_validator_always():
    counts = [R.role_counts(8, 1, h) for h in (0.0, 0.3, 0.6, 1.0)]
    assert [c[0] for c in counts] == sorted(c[0] for c in counts)
    assert counts[0] == (0, 7, 1) and counts[-1] == (7, 0, 1)
    assert R.role_counts(4, 0, 0.5)[2] == 1


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from(R.ROLES), min_size=n, max_size=n),
    st.lists(st.floats(0, 1), min_size=n, max_size=n),
    st.lists(st.booleans(), min_size=n, max_size=n))), st.floats(0, 1))
def test_assignment_invariants(data, hardness):
    prev, scores, ex = data
    new, switches = R.assign_roles(prev, torch.tensor(scores, dtype=torch.float64), torch.tensor(ex), hardness, "test")
    assert "validator" in new
    assert sum(r == "validator" for r in new) == max(1, sum(r == "validator" for r in prev))
    assert {s.rank for s in switches} == {i for i in range(len(prev)) if new[i] != prev[i]}
    assert all(s.reason.startswith("test") for s in switches)
    # the best non-validators are optimizers, the worst explorers
    others = [i for i in range(len(new)) if new[i] != "validator"]
    opt = [scores[i] for i in others if new[i] == "optimizer" and not ex[i]]
    exp = [scores[i] for i in others if new[i] == "explorer" and not ex[i]]
    if opt and exp:
        assert min(opt) >= max(exp)


def test_assignment_is_deterministic_and_logs_reasons():
    prev = ["explorer", "optimizer", "optimizer", "validator"]
    scores = torch.tensor([0.9, 0.2, 0.5, 0.7])
    new, sw = R.assign_roles(prev, scores, torch.zeros(4, dtype=torch.bool), 1 / 3, "round 3")
    assert new == ["optimizer", "explorer", "optimizer", "validator"]
    assert [(s.rank, s.old, s.new) for s in sw] == [(0, "explorer", "optimizer"), (1, "optimizer", "explorer")]
    assert "score rank 3/3" in sw[1].reason and "1 explorer(s)" in sw[1].reason
    assert R.assign_roles(prev, scores, torch.zeros(4, dtype=torch.bool), 1 / 3, "round 3")[0] == new


def test_exploit_bottom_copies_top_within_architecture():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.3, 0.8, 0.2, 0.4, 0.7, 0.6, 0.05])
    ex = torch.zeros(10, dtype=torch.bool)
    pairs = R.exploit_pairs(scores, ex, ["a"] * 10, 0.2)
    assert sorted(pairs) == [(0, 4), (9, 1)]  # bottom 2 copy top 2, worst copies best
    mixed = R.exploit_pairs(scores[:4], ex[:4], ["a", "b", "a", "b"], 0.2)
    assert sorted(mixed) == [(0, 2), (3, 1)]
    assert R.exploit_pairs(scores, ex, ["a"] * 10, 0.0) == []
    flagged = R.exploit_pairs(torch.tensor([0.9, 0.95, math.nan, 0.5]), torch.tensor([False, True, True, False]),
                              ["a"] * 4, 0.2)
    assert flagged == [(2, 0)]  # a flagged agent (ties: the higher rank) copies the best healthy one
    assert R.exploit_pairs(torch.tensor([0.5, 0.5]), torch.zeros(2, dtype=torch.bool), ["a"] * 2, 0.5) == []


def test_pbt_perturb_and_noise():
    g = torch.Generator().manual_seed(0)
    seen = {round(R.pbt_perturb(1.0, g), 6) for _ in range(40)}
    assert seen == {0.8, 1.2}
    assert R.pbt_perturb(9.5, torch.Generator().manual_seed(1)) <= R.LR_MULT_BOUNDS[1]
    flat = torch.full((10000,), 2.0)
    noisy = R.param_noise(flat, 0.1, torch.Generator().manual_seed(0))
    assert float((noisy - flat).std()) == pytest.approx(0.2, rel=0.05)
    assert R.param_noise(flat, 0.0, g) is flat


def _learner():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    x, y = torch.randn(16, 3), torch.randn(16, 1)

    def batches():
        while True:
            yield x, y
    return TorchLearner(m, torch.optim.SGD(m.parameters(), lr=0.1), batches(),
                        lambda mod, b: ((mod(b[0]) - b[1]) ** 2).mean(), fwd_flops=1, bwd_flops=2), m, x, y


def test_sam_gradient_matches_the_definition():
    learner, m, x, y = _learner()
    before = [p.detach().clone() for p in m.parameters()]
    out = R.sam_forward_backward(learner, 0.05)
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))  # weights restored
    # reference: gradient at w + rho g / ||g|| computed by hand
    loss_fn = lambda: ((m(x) - y) ** 2).mean()  # noqa: E731
    g = torch.autograd.grad(loss_fn(), list(m.parameters()))
    norm = torch.sqrt(sum((t ** 2).sum() for t in g))
    with torch.no_grad():
        for p, t in zip(m.parameters(), g):
            p.add_(0.05 * t / norm)
    g_sam = torch.autograd.grad(loss_fn(), list(m.parameters()))
    for p, t in zip(m.parameters(), g_sam):
        assert torch.allclose(p.grad, t, atol=1e-6)
    assert out["sam_loss"] >= out["loss"] - 1e-6  # ascent direction (first order)


def test_swa_state_is_a_running_mean():
    s = R.SWAState()
    for v in (1.0, 2.0, 6.0):
        s.update(torch.full((3,), v))
    st2 = R.SWAState()
    st2.load_state_dict(s.state_dict())
    assert s.take(torch.float32).tolist() == [3.0] * 3 and s.count == 0 and s.take(torch.float32) is None
    assert st2.count == 3


def test_validator_reports_round_trip_and_flags():
    n = 3
    rows = torch.tensor([[0.9, 0.3, 0.1, 1.0, 0.2], [0.8, 0.4, 0.1, 1.0, 0.1], [0.1, 5.0, 0.5, 0.5, 0.6]])
    reports = [R.encode_report(None, n, 0.3), R.encode_report(rows, n, 0.4), R.encode_report(rows * 0.5, n, math.nan)]
    pub = R.decode_reports(reports, n, divergence_factor=3.0)
    assert pub.validators == 2
    assert pub.columns["metric"].tolist() == pytest.approx([0.675, 0.6, 0.075])
    assert pub.train_loss[:2].tolist() == pytest.approx([0.3, 0.4])
    # agent 2: non-finite training loss and a validation loss far above the median
    assert pub.excluded.tolist() == [False, False, True]
    assert R.flag_agents(torch.tensor([1.0, 1.1, 2.0]), torch.ones(3), 3.0).tolist() == [False] * 3
    assert R.flag_agents(torch.tensor([1.0, math.inf, 1.0]), torch.ones(3), 3.0).tolist() == [False, True, False]
    none = R.decode_reports([R.encode_report(None, 2, 0.1)] * 2, 2, 3.0)
    assert none.columns == {} and none.excluded.tolist() == [False, False]


@given(seed=st.integers(0, 2**31), n=st.integers(1, 16), lo=st.floats(1e-3, 10.0),
       span=st.floats(1.0, 1e4))
@settings(max_examples=80, deadline=None)
def test_pbt_sampling_covers_its_range_and_stays_in_bounds(seed, n, lo, span):
    hi = min(1e3, lo * span)
    xs = R.log_uniform_strata(n, lo, hi, torch.Generator().manual_seed(seed))
    assert len(xs) == n and all(lo <= x <= hi for x in xs)
    if hi > lo * (1 + 1e-9):  # one value in each of the n equal log strata: the whole range is covered
        width = (math.log(hi) - math.log(lo)) / n
        t = sorted((math.log(x) - math.log(lo)) / width for x in xs)  # stratum k holds t in [k, k + 1)
        assert all(k - 1e-6 <= tk <= k + 1 + 1e-6 for k, tk in enumerate(t))
        assert min(xs) <= lo * math.exp(width) * (1 + 1e-9) and max(xs) >= hi * math.exp(-width) * (1 - 1e-9)
    g = torch.Generator().manual_seed(seed)
    for x in xs:  # the explore step keeps a multiplier in the range too
        assert lo <= R.pbt_perturb(x, g, (lo, hi), (0.5, 2.0)) <= hi


def test_pbt_sampling_refuses_an_empty_range():
    with pytest.raises(ValueError, match="0 < lo <= hi"):
        R.log_uniform_strata(4, 2.0, 1.0, torch.Generator())
