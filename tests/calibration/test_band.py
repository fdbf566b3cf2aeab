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
    # 1, 3, 1, 3, 2 (variance 1): sqrt(2 x 1) / mean 2
    assert B.difference_cv([1.0, 1.0, 3.0, 3.0, 1.0, 1.0, 3.0, 3.0, 2.0, 2.0]) == pytest.approx(math.sqrt(2) / 2)
    # scatter only: five blocks [1, 3]: W = 2 pooled, block means all 2 so L = max(0, 0 - 2 / 2) = 0;
    # n = 10: sqrt(2 x 2 / 10) / 2 (the block means' spread alone would say 0)
    assert B.difference_cv([1.0, 3.0] * 5) == pytest.approx(math.sqrt(0.4) / 2)
    # both: blocks [0, 2], [2, 4]: W = 2, block means 1, 3 (variance 2), L = 2 - 2 / 2 = 1, n = 4:
    # sqrt(2 (1 + 2 / 4)) / mean 2
    assert B.difference_cv([0.0, 2.0, 2.0, 4.0], blocks=2) == pytest.approx(math.sqrt(3) / 2)
    # 11 values in 5 blocks: 2 each, the last takes 3
    assert B._blocks(range(11), 5) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9, 10]]
    assert B.difference_cv([3.0] * 9) == 0.0  # fewer than 2 a block: nothing to read


def test_half_widths_golden():
    """2 x the difference's cv plus the stolen share: step 2 x 0.05 + 0.02 = 0.12; overhead
    2 x hypot(0.05, 0.10) + 0.02 = 2 x 0.1118 + 0.02 = 0.2436."""
    w = B.half_widths(0.05, 0.10, 0.02)
    assert w["step_time"] == pytest.approx(0.12, abs=1e-4)
    assert w["comm_overhead"] == pytest.approx(0.2436, abs=1e-4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=10, max_size=60), st.floats(0.1, 100.0))
def test_difference_cv_is_scale_free_and_the_band_holds_its_centre(xs, c):
    assert B.difference_cv([c * x for x in xs]) == pytest.approx(B.difference_cv(xs), rel=1e-6, abs=1e-12)
    w = B.half_widths(B.difference_cv(xs), 0.0)["step_time"]
    lo, hi = B.band(c, w)
    assert lo <= c <= hi and hi - c == pytest.approx(c * w)


@pytest.mark.parametrize("level_sd,step_sd,low,high", [(0.0, 0.2, 0.92, 0.98), (0.1, 0.0, 0.90, 0.96),
                                                        (0.05, 0.2, 0.90, 0.97)])
def test_the_band_covers_a_later_runs_mean(level_sd, step_sd, low, high):
    """Steps that scatter about a level: a calibration of 30 steps whose level is drawn anew
    every 6 (the drift it sees), then a run of 30 at one level of its own. With scatter only,
    the run's mean lies within 2 x difference_cv of the calibration's about 95% of 2,000
    draws. Where the level drifts, a little less (93% with the level alone): five blocks
    estimate its spread with 4 degrees of freedom, and 2 is a normal's quantile, not
    Student's (2.78); the run sitting at one level while the calibration averages five
    makes up part of it."""
    import numpy as np

    rng = np.random.default_rng(0)
    inside = 0
    for _ in range(2000):
        cal = 1.0 + np.repeat(rng.normal(0.0, level_sd, 5), 6) + rng.normal(0.0, step_sd, 30)
        run = 1.0 + rng.normal(0.0, level_sd) + rng.normal(0.0, step_sd, 30)
        w = B.half_widths(B.difference_cv(cal.tolist()), 0.0)["step_time"]
        inside += abs(run.mean() / cal.mean() - 1) <= w
    assert low <= inside / 2000 <= high


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
    block means' variance 1.2e-4 = L: sqrt(2 x 1.2e-4) / mean 0.108 = 0.14344. Held at the
    collectives (0.01 s transfer + wait): 0.01 x 5 then 0.02 x 5, blocks [0.01, 0.01] x 2,
    [0.01, 0.02], [0.02, 0.02] x 2: W = 5e-5 / 9 (the third block's variance over 10 - 5
    degrees of freedom... 1 of them), block means 0.01, 0.01, 0.015, 0.02, 0.02 (variance
    2.5e-5), L = 2.5e-5 - W / 2, n = 10: sqrt(2 (L + W / 10)) / 0.015; stolen 0.6% and the core
    share moved by 0.4%: + 1%."""
    w = band_fit(_record())
    step = math.sqrt(2 * 1.2e-4) / 0.108
    within = 5e-5 / 5  # the third block's (0.01 - 0.015)^2 + (0.02 - 0.015)^2 over 10 values - 5 blocks
    held = math.sqrt(2 * (2.5e-5 - within / 2 + within / 10)) / 0.015
    assert w["step_time"] == pytest.approx(2 * step + 0.01, rel=1e-3)
    assert w["comm_overhead"] == pytest.approx(2 * math.hypot(step, held) + 0.01, rel=1e-3)
    assert band_fit(_record(step_seconds_per_rank=[[0.1] * 9, [0.1] * 9])) is None  # too few steps


def test_the_band_reaches_the_profile_the_report_and_compare():
    m = _record()
    doc = device_doc("cpu-calibrated", m, 1e9)
    assert DeviceProfile.model_validate(doc).prediction_band == doc["prediction_band"] == band_fit(m)
    header = profile_text(doc, {"kind": "fabric", "name": "f"}, m.with_(arrival_waits=[]), [])
    assert "# prediction band: step time +-30%" in header and "wider than +-20% for step time" in header
    pred = {"step_time_s": 0.1, "comm_overhead": 0.2}
    pred["band"] = prediction_band(pred, {"step_time": 0.1, "comm_overhead": 0.25})
    assert pred["band"]["step_time_s"] == pytest.approx([0.09, 0.11])
    meas = {"step_time_s": 0.105, "comm_overhead": 0.26}
    assert [v["inside"] for v in band_verdicts(pred, meas)] == [True, False]
    lines = band_lines(pred, meas)
    assert lines[0].startswith("step time: measured 105.000 ms inside the predicted band 90.000 ms - 110.000 ms (+-10%)")
    assert "overhead: measured 26.00% OUTSIDE the predicted band 15.00% - 25.00% (+-25%)" in lines[1]
    assert band_lines({"step_time_s": 0.1}, meas) == []  # an uncalibrated prediction: no band, no lines
