"""The convergence math: the base law against the paper's configurations, the inverse,
the multiplier and the user's fit, and the scenario section."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher.models.convergence import (CHINCHILLA, Efficiency, ScalingLaw, first_at_or_below, fit_data_term, floor,
                                     loss, multiplier, smooth, tokens_to_loss)
from oresearcher.errors import UserError
from oresearcher.scenario import load_scenario


def test_constants_are_the_papers():
    assert (CHINCHILLA.E, CHINCHILLA.A, CHINCHILLA.B, CHINCHILLA.alpha, CHINCHILLA.beta) == (
        1.69, 406.4, 410.7, 0.34, 0.28)


@pytest.mark.parametrize("name, n, d, by_hand", [
    # by hand from the printed constants (module docstring): 1.69 + 0.08349 + 0.16316
    ("chinchilla-70b", 70e9, 1.4e12, 1.937),
    # 1.69 + 0.05211 + 0.25115
    ("gopher-280b", 280e9, 300e9, 1.993),
])
def test_law_reproduces_published_configurations(name, n, d, by_hand):
    got = loss(CHINCHILLA, n, d)
    print(f"{name}: law {got:.4f} by hand {by_hand} error {got / by_hand - 1:+.3%}")
    assert got == pytest.approx(by_hand, rel=0.01)


def test_chinchilla_beats_gopher_as_the_paper_says():
    assert loss(CHINCHILLA, 70e9, 1.4e12) < loss(CHINCHILLA, 280e9, 300e9)


@settings(max_examples=60, deadline=None)
@given(n=st.floats(1e6, 1e12), gap=st.floats(1e-3, 5.0), m=st.floats(0.1, 10.0))
def test_tokens_to_loss_inverts_the_law(n, gap, m):
    target = floor(CHINCHILLA, n) + gap
    d = tokens_to_loss(CHINCHILLA, n, target, m)
    assert loss(CHINCHILLA, n, d, m) == pytest.approx(target, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(n=st.floats(1e6, 1e12), d=st.floats(1e6, 1e13), m1=st.floats(0.1, 10.0), m2=st.floats(0.1, 10.0))
def test_more_efficient_is_never_worse(n, d, m1, m2):
    lo, hi = sorted((m1, m2))
    assert loss(CHINCHILLA, n, d, hi) <= loss(CHINCHILLA, n, d, lo)
    assert loss(CHINCHILLA, n, d, lo) > floor(CHINCHILLA, n)


def test_target_at_or_below_the_floor_is_never_reached():
    assert tokens_to_loss(CHINCHILLA, 1.3e9, floor(CHINCHILLA, 1.3e9)) == math.inf
    assert tokens_to_loss(CHINCHILLA, 1.3e9, 1.0) == math.inf


def test_smooth_and_first_passage_by_hand():
    assert smooth([4, 2, 6, 0], 3) == pytest.approx([3, 4, 8 / 3, 3])
    assert first_at_or_below([5, 4, 3, 4, 2], 3) == 3
    assert first_at_or_below([5, 4], 3) is None


@settings(max_examples=30, deadline=None)
@given(k=st.floats(0.4, 2.5))
def test_multiplier_of_a_curve_run_k_times_faster_is_k(k):
    law = ScalingLaw(1.0, 0.0, 5.0, 1.0, 0.5)
    base = [loss(law, 1.0, s) for s in range(1, 2001)]
    fast = [loss(law, 1.0, s * k) for s in range(1, 2001)]
    assert multiplier(base, fast) == pytest.approx(k, rel=0.03)


def test_efficiency_band_is_the_seed_range():
    e = Efficiency.of([0.9, 1.2, 1.0])
    assert (e.multiplier, e.low, e.high) == (1.0, 0.9, 1.2)
    with pytest.raises(ValueError):
        Efficiency.of([])


def test_fit_recovers_a_clean_data_term():
    tokens = [1000.0 * s for s in range(10, 400)]
    losses = [0.9 + 40.0 / t ** 0.45 for t in tokens]
    c, b, beta = fit_data_term(tokens, losses)
    assert c == pytest.approx(0.9, rel=0.02) and beta == pytest.approx(0.45, rel=0.05)
    assert all(abs(c + b / t ** beta - v) < 0.01 for t, v in zip(tokens, losses))


def test_scenario_section_is_typed_and_optional(tmp_path):
    plain = load_scenario("scenarios/8xA100.yaml")
    assert plain.convergence is None and "convergence" not in plain.resolved()
    sc = load_scenario("scenarios/8xA100.yaml", ["convergence.target_loss=2.6", "convergence.law.E=1.5"])
    assert sc.convergence.target_loss == 2.6 and sc.convergence.law.law().E == 1.5
    assert sc.resolved()["convergence"]["law"]["B"] == 410.7
    with pytest.raises(UserError, match="convergence.law.beta"):
        load_scenario("scenarios/8xA100.yaml", ["convergence.law.beta=-1"])
    with pytest.raises(UserError, match="convergence.speed"):
        load_scenario("scenarios/8xA100.yaml", ["convergence.speed=2"])


def test_compare_puts_a_run_beside_the_prediction(tmp_path, capsys):
    from oresearcher.compare import main as compare_main
    import json

    law = ScalingLaw(0.9, 0.0, 40.0, 1.0, 0.45)
    section = {"law": {"E": 0.9, "A": 0.0, "B": 40.0, "alpha": 1.0, "beta": 0.45, "source": "a fit"},
               "n_params": 1e6, "tokens_per_step": 256,
               "efficiency": {"multiplier": 1.0, "low": 0.8, "high": 1.25, "measured": True}}
    # a run that follows the law exactly: every row's error is about zero (smoothing only)
    metrics = {str(r): [{"step": i, "loss": loss(law, 1e6, (i + 1) * 256)} for i in range(200)] for r in range(2)}
    figures = {k: 1.0 for k in ("step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s",
                                "comm_overhead", "wire_bytes_per_step")}
    pred = {**figures, "backend": "sim", "scenario": {"name": "x"}, "convergence": section}
    meas = {**figures, "backend": "gloo", "scenario": {"name": "x"}, "metrics": metrics}
    for name, rep in (("pred.json", pred), ("meas.json", meas)):
        (tmp_path / name).write_text(json.dumps(rep))
    assert compare_main([str(tmp_path / "pred.json"), str(tmp_path / "meas.json")]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("step ")]
    assert len(rows) == 5 and rows[-1].split()[1] == "200:"
    errors = [float(ln.rsplit("(", 1)[1].rstrip("%)")) for ln in rows]
    assert all(abs(e) < 1.0 for e in errors), rows
