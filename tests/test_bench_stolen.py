"""The sim-to-real benchmarks print how much CPU time the hypervisor took while they ran
(a host busier than its load average): the share between two /proc/stat readings; the
gloo chain also prints how far apart the ranks' compute was (the rank split)."""
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_sim_to_real as b  # noqa: E402


def test_stolen_share_is_stolen_ticks_over_all_ticks():
    assert b.stolen((10, 1000), (30, 1200)) == pytest.approx(0.1)
    assert b.stolen((10, 1000), (10, 1000)) is None  # no time passed: no share
    assert b.stolen(None, (10, 1000)) is None
    assert b.stolen_text([None, 0.113]) == "-, 11"


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc/stat only")
def test_cpu_ticks_read_this_machine():
    a = b.cpu_ticks()
    time.sleep(0.05)
    c = b.cpu_ticks()
    assert 0 <= a[0] <= c[0] and 0 < a[1] <= c[1] and a[0] <= a[1]
    x = b.stolen(a, c)
    assert x is None or 0.0 <= x <= 1.0
    assert b.host_stolen(a) == "" or b.host_stolen(a).endswith("% of the CPU time stolen by the hypervisor")


def test_rank_split_of_a_calibration_is_read_from_its_profile_header(tmp_path):
    """The gloo chain prints, per pair, how far apart the ranks' compute per step was in
    the calibration (from the profile's header) and in the run."""
    prof = tmp_path / "p.yaml"
    prof.write_text("# compute: the oresearcher program declares 1.393e+09 FLOP per step in 9 Compute ops, measured "
                    "49.578 ms on the slowest rank (all ranks at once, fp32; per rank: 49.578, 45.058 ms; step time "
                    "spread (std/mean) per rank: 0.17, 0.12).\nkind: device\n")
    assert b.calibration_split(prof) == pytest.approx((49.578 - 45.058) / ((49.578 + 45.058) / 2))
    prof.write_text("kind: device\n")
    assert b.calibration_split(prof) is None
    assert b.calibration_split(tmp_path / "missing.yaml") is None
    assert b.pairs_text([(0.056, 0.18), (None, 0.0)]) == "6 / 18; - / 0"
