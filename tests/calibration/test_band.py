"""The band a calibrated prediction carries (oresearcher/calibration/band.py): worked by hand,
its properties, and how it travels from calibration through the simulator to compare."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from oresearcher.calibration import band as B
from oresearcher.calibration.profiles import band_fit, device_doc, profile_text
from oresearcher.calibration.record import Measurement
from oresearcher.hardware import DeviceProfile
from oresearcher.reporting.compare import band_lines, band_verdicts
from oresearcher.sim.simulate import prediction_band


def test_difference_cv_golden():
    # level only: blocks [1, 1], [3, 3], [1, 1], [3, 3], [2, 2]: no scatter inside, block means
    # 1, 3, 1, 3, 2 (variance 1): sqrt(2 x 1) / mean 2, carried by 5 block means: 4 dof
    cv, dof = B.difference_cv([1.0, 1.0, 3.0, 3.0, 1.0, 1.0, 3.0, 3.0, 2.0, 2.0])
    assert cv == pytest.approx(math.sqrt(2) / 2) and dof == pytest.approx(4.0)
    # scatter only: five blocks [1, 3]: W = 2 pooled over 10 - 5 dof, block means all 2 so
    # L = 0; n = 10: sqrt(2 x 2 / 10) / 2 (the block means' spread alone would say 0)
    cv, dof = B.difference_cv([1.0, 3.0] * 5)
    assert cv == pytest.approx(math.sqrt(0.4) / 2) and dof == pytest.approx(5.0)
    # both: blocks [0, 2], [2, 4]: W = 2 (2 dof), block means 1, 3 (variance 2, 1 dof),
    # L = 2 - 2 / 2 = 1, n = 4: V = 2 L + 2 W / n = 2 + 1 = 3; Satterthwaite, the drift's
    # part at 1 dof and the scatter's at 2: 3^2 / (2^2 / 1 + 1^2 / 2) = 9 / 4.5 = 2
    cv, dof = B.difference_cv([0.0, 2.0, 2.0, 4.0], blocks=2)
    assert cv == pytest.approx(math.sqrt(3) / 2) and dof == pytest.approx(2.0)
    # 11 values in 5 blocks: 2 each, the last takes 3
    assert B._blocks(range(11), 5) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9, 10]]
    assert B.difference_cv([3.0] * 9) == (0.0, math.inf)  # fewer than 2 a block: nothing to read
    assert B.difference_cv([3.0] * 10) == (0.0, math.inf)  # no spread at all: exact


def test_half_widths_golden():
    """Student's 97.5% quantile times the spread, plus the stolen share: step, 4 dof,
    2.7764 x 0.05 + 0.02 = 0.15882; overhead, spreads 0.05 (4 dof) and 0.10 (25 dof) in
    quadrature: 0.1118, Satterthwaite 0.0125^2 / (0.0025^2 / 4 + 0.01^2 / 25) = 27.59 dof,
    t 2.0490: 2.0490 x 0.1118 + 0.02 = 0.24909. Exact spreads (inf dof): 1.96."""
    w = B.half_widths((0.05, 4.0), (0.10, 25.0), 0.02)
    assert w["step_time"] == pytest.approx(2.7764 * 0.05 + 0.02, abs=1e-4)
    assert w["comm_overhead"] == pytest.approx(2.0490 * math.hypot(0.05, 0.10) + 0.02, abs=2e-4)
    assert B.half_widths((0.05, math.inf), (0.0, math.inf))["step_time"] == pytest.approx(1.959964 * 0.05, rel=1e-6)


def test_half_widths_weigh_compute_and_collectives_by_their_share_of_a_step():
    """h = 0.25 of a step held at collectives; compute spread 0.04 (4 dof), collectives' 0.2
    (25 dof). Step: hypot(0.75 x 0.04, 0.25 x 0.2) = hypot(0.03, 0.05) = 0.05831 at
    0.0034^2 / (0.0009^2 / 4 + 0.0025^2 / 25) = 25.55 dof. Overhead: 0.75 x hypot(0.04, 0.2)
    = 0.15297 at 0.0416^2 / (0.0016^2 / 4 + 0.04^2 / 25) = 26.77 dof."""
    from scipy.stats import t

    w = B.half_widths((0.04, 4.0), (0.2, 25.0), 0.0, share=0.25)
    assert w["step_time"] == pytest.approx(t.ppf(0.975, 25.55) * 0.05831, rel=1e-3)
    assert w["comm_overhead"] == pytest.approx(t.ppf(0.975, 26.77) * 0.15297, rel=1e-3)
    # h = 0.15 / 10 steps = 0.015 s a step over 0.1 + 0.015
    assert B.exposed_share([0.1] * 10, [0.01, 0.02] * 5) == pytest.approx(0.015 / 0.115)
    assert B.exposed_share([0.1] * 10, []) == 0.0


@settings(max_examples=60, deadline=None)
@given(c=st.floats(0.0, 0.5), e=st.floats(0.0, 2.0), h=st.floats(0.0, 1.0))
def test_a_steps_band_lies_between_its_parts_and_the_overhead_narrows_as_collectives_take_the_step(c, e, h):
    w = B.half_widths((c, 10.0), (e, 10.0), share=h)
    t10 = B.quantile(10.0)
    assert w["step_time"] <= t10 * max(c, e) * 1.0000001 + 1e-12  # a weighted mean's spread, not a sum's
    spread = (1 - h) * math.hypot(c, e)  # at 10 dof each, the two together carry at least 10
    assert B.quantile(math.inf) * spread - 1e-12 <= w["comm_overhead"] <= t10 * spread + 1e-12


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=10, max_size=60), st.floats(0.1, 100.0))
def test_difference_cv_is_scale_free_and_the_band_holds_its_centre(xs, c):
    cv, dof = B.difference_cv(xs)
    cv_c, dof_c = B.difference_cv([c * x for x in xs])
    assert cv_c == pytest.approx(cv, rel=1e-6, abs=1e-12)
    assert dof_c == pytest.approx(dof, rel=1e-6) or dof_c == dof  # inf stays inf
    assert min(4, len(xs) - 5) <= dof <= len(xs) - 5 + 4 or dof == math.inf  # between the parts' own
    w = B.half_widths((cv, dof), (0.0, math.inf))["step_time"]
    lo, hi = B.band(c, w)
    assert lo <= c <= hi and hi - c == pytest.approx(c * w)


@pytest.mark.parametrize("level_sd,step_sd,low", [(0.0, 0.2, 0.95), (0.1, 0.0, 0.95), (0.05, 0.2, 0.90)])
def test_the_band_covers_a_later_runs_mean_95_percent_of_the_time(level_sd, step_sd, low):
    """Steps that scatter about a level: a calibration of 30 steps whose level is drawn anew
    every 6 (the drift it sees), then a run of 30 at one level of its own. The run's mean
    lies within the band about the calibration's in 95-98% of 2,000 draws where the
    scatter or the drift carries the spread (97%, 97%; with a normal's 2 in place of
    Student's quantile the drift alone gives 93%: five block means are 4 degrees of
    freedom). A drift smaller than the scatter's share of a block mean is seen poorly by
    five blocks: 92% there."""
    import numpy as np

    rng = np.random.default_rng(0)
    inside = 0
    for _ in range(2000):
        cal = 1.0 + np.repeat(rng.normal(0.0, level_sd, 5), 6) + rng.normal(0.0, step_sd, 30)
        run = 1.0 + rng.normal(0.0, level_sd) + rng.normal(0.0, step_sd, 30)
        w = B.half_widths(B.difference_cv(cal.tolist()), (0.0, math.inf))["step_time"]
        inside += abs(run.mean() / cal.mean() - 1) <= w
    assert low <= inside / 2000 <= 0.98


def test_contention_change_golden():
    # 2 cores: at load 4 a process gets half a core, at load 8 a quarter; moved by 0.25 / 0.375
    assert B.core_share(4.0, 2) == 0.5 and B.core_share(1.0, 2) == 1.0 and B.core_share(0.0, 2) == 1.0
    assert B.contention_change(4.0, 8.0, 2) == pytest.approx(0.25 / 0.375)
    assert B.contention_change(1.5, 1.9, 2) == 0.0  # under the core count: a whole core each, no change


def _record(**kw):
    # 2 ranks x 10 steps: the pace 0.1 s for 6 steps, then 0.12 s (a neighbour arrived)
    steps = [[0.1] * 6 + [0.12] * 4, [0.1] * 6 + [0.12] * 4]
    base = dict(flops_per_step=2e9, compute_step_s=0.11, host_overhead_s=5e-6, world_size=2, backend="gloo",
                step_seconds_per_rank=steps, inrun_collectives=[{"kind": "AllReduce", "bytes": 1, "time_s": 0.01}],
                arrival_waits=[{"kind": "AllReduce", "wait_s": w} for w in [0.0] * 5 + [0.01] * 5],
                stolen_share=0.006, contention_change=0.004)
    return Measurement(**{**base, **kw})


def test_band_fit_from_a_calibration_golden():
    """Pace by blocks of 2 steps: 0.1, 0.1, 0.1, 0.12, 0.12: no scatter inside a block (W 0),
    block means' variance 1.2e-4 = L: sqrt(2 x 1.2e-4) / mean 0.108 = 0.14344 at 4 dof
    (t 2.7764: +-40.8% with the 1% below). Held at the collectives (0.01 s transfer + wait):
    0.01 x 5 then 0.02 x 5, blocks [0.01, 0.01] x 2, [0.01, 0.02], [0.02, 0.02] x 2: W from
    the third block alone, L = the block means' variance 2.5e-5 less W / 2, n = 10; stolen
    0.6% and the core share moved by 0.4%: + 1%."""
    w = band_fit(_record())
    step = math.sqrt(2 * 1.2e-4) / 0.108  # W = 0: the block means' 4 dof
    within = 5e-5 / 5  # the third block's (0.01 - 0.015)^2 + (0.02 - 0.015)^2 over 10 values - 5 blocks
    level = 2.5e-5 - within / 2  # the block means' variance less W / b
    v = 2 * level + 2 * within / 10  # = 2 (L + W / n)
    held = math.sqrt(v) / 0.015
    held_dof = v ** 2 / ((2 * level) ** 2 / 4 + (2 * within / 10) ** 2 / 5)
    h = 0.015 / (0.108 + 0.015)  # 0.15 s held over 10 steps of 0.108 s compute
    a, b = (1 - h) * step, h * held
    from scipy.stats import t
    step_dof = (a * a + b * b) ** 2 / (a ** 4 / 4 + b ** 4 / held_dof)
    over_dof = (step ** 2 + held ** 2) ** 2 / (step ** 4 / 4 + held ** 4 / held_dof)
    assert w["step_time"] == pytest.approx(t.ppf(0.975, step_dof) * math.hypot(a, b) + 0.01, rel=1e-3)
    assert w["comm_overhead"] == pytest.approx(t.ppf(0.975, over_dof) * (1 - h) * math.hypot(step, held) + 0.01,
                                               rel=1e-3)
    assert band_fit(_record(step_seconds_per_rank=[[0.1] * 9, [0.1] * 9])) is None  # too few steps


def test_the_band_reaches_the_profile_the_report_and_compare():
    m = _record()
    doc = device_doc("cpu-calibrated", m, 1e9)
    assert DeviceProfile.model_validate(doc).prediction_band == doc["prediction_band"] == band_fit(m)
    header = profile_text(doc, {"kind": "fabric", "name": "f"}, m.with_(arrival_waits=[]), [])
    assert "# prediction band: step time +-35%" in header and "wider than +-20% for step time" in header
    pred = {"step_time_s": 0.1, "comm_overhead": 0.2}
    pred["band"] = prediction_band(pred, {"step_time": 0.1, "comm_overhead": 0.25})
    assert pred["band"]["step_time_s"] == pytest.approx([0.09, 0.11])
    meas = {"step_time_s": 0.105, "comm_overhead": 0.26}
    assert [v["inside"] for v in band_verdicts(pred, meas)] == [True, False]
    lines = band_lines(pred, meas)
    assert lines[0].startswith("step time: measured 105.000 ms inside the predicted band 90.000 ms - 110.000 ms (+-10%)")
    assert "overhead: measured 26.00% OUTSIDE the predicted band 15.00% - 25.00% (+-25%)" in lines[1]
    assert band_lines({"step_time_s": 0.1}, meas) == []  # an uncalibrated prediction: no band, no lines
