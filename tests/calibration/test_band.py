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


def test_level_cv_golden():
    # two blocks of 5 steps at 1 and 2 s: block means 1, 2; std 0.7071 over a mean of 1.5
    assert B.block_means([1.0] * 5 + [2.0] * 5, blocks=2) == [1.0, 2.0]
    assert B.level_cv([1.0] * 5 + [2.0] * 5, blocks=2) == pytest.approx(math.sqrt(0.5) / 1.5)
    # 11 values in 5 blocks: 2 each, the last takes 3
    assert B.block_means(list(range(11)), blocks=5) == [0.5, 2.5, 4.5, 6.5, 9.0]
    assert B.level_cv([3.0] * 9) == 0.0  # fewer than 2 a block: one block, no spread


def test_half_widths_golden():
    """2 x sqrt(2) x cv plus the stolen share: step 2.828 x 0.05 + 0.02 = 0.1614; overhead
    2.828 x hypot(0.05, 0.10) + 0.02 = 2.828 x 0.1118 + 0.02 = 0.3362."""
    w = B.half_widths(0.05, 0.10, 0.02)
    assert w["step_time"] == pytest.approx(0.1614, abs=1e-4)
    assert w["comm_overhead"] == pytest.approx(0.3362, abs=1e-4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=10, max_size=60), st.floats(0.1, 100.0))
def test_level_cv_is_scale_free_and_the_band_holds_its_centre(xs, c):
    assert B.level_cv([c * x for x in xs]) == pytest.approx(B.level_cv(xs), rel=1e-6, abs=1e-12)
    w = B.half_widths(B.level_cv(xs), 0.0)["step_time"]
    lo, hi = B.band(c, w)
    assert lo <= c <= hi and hi - c == pytest.approx(c * w)


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
    """Pace by blocks of 2 steps: 0.1, 0.1, 0.1, 0.12, 0.12 (cv = std 0.010954 / mean 0.108 =
    0.10143); held at the collectives (0.01 s transfer + wait): 0.01 x 5 then 0.02 x 5, blocks
    0.01, 0.01, 0.015, 0.02, 0.02 (cv 0.005 / 0.015 = 0.33333); stolen 0.6% and the core
    share moved by 0.4%: + 1%."""
    w = band_fit(_record())
    k = 2 * math.sqrt(2)
    assert w["step_time"] == pytest.approx(k * 0.10143 + 0.01, rel=1e-3)
    assert w["comm_overhead"] == pytest.approx(k * math.hypot(0.10143, 1 / 3) + 0.01, rel=1e-3)
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
