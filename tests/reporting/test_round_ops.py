"""oresearcher.reporting.round_ops: the op-by-op split of a hosted round on its critical rank,
on a hand-made trace (numbers checkable by hand)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oresearcher.reporting import round_ops as R


def _write(tmp_path: Path) -> Path:
    """Two ranks, one agent each, two rounds (0-10 ms, 10-30 ms). In round 2 rank 0
    computes 5 ms and waits 13 ms at the gather; rank 1 computes 12.5 ms and is the last
    to arrive (5 ms in the gather): the critical rank."""
    lanes = {(0, "compute"): 0, (0, "blocked"): 1, (1, "compute"): 2, (1, "blocked"): 3}
    ev = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": t, "args": {"name": f"rank {r} {lane}"}}
          for (r, lane), t in lanes.items()]
    spans = {0: [("compute", "fwd_bwd", 0, 4), ("blocked", "blocked:round_gather", 5, 9),
                 ("compute", "fwd_bwd", 10, 14), ("compute", "optimizer", 14, 15),
                 ("blocked", "blocked:round_gather", 16, 29)],
             1: [("compute", "fwd_bwd", 0, 8), ("blocked", "blocked:round_gather", 8, 9),
                 ("compute", "swap_in", 10, 10.5), ("compute", "fwd_bwd", 10.5, 20.5),
                 ("compute", "optimizer", 20.5, 22.5), ("blocked", "blocked:round_gather", 24, 29),
                 ("compute", "fusion", 29, 29.5)]}
    for r, rows in spans.items():
        for lane, name, s, e in rows:
            ev.append({"ph": "X", "name": name, "pid": 0, "tid": lanes[(r, lane)], "ts": s * 1e3, "dur": (e - s) * 1e3})
    metrics = {str(r): [{"time_s": 0.010, f"units.{r}": 4.0, f"units.{1 - r}": 4.0, f"device_s.{r}": 0.0},
                        {"time_s": 0.030, f"units.{r}": 3.0 + 7 * r, f"units.{1 - r}": 10.0 - 7 * r,
                         f"device_s.{r}": 0.0}] for r in (0, 1)}
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": ev}))
    (tmp_path / "report.json").write_text(json.dumps({"metrics": metrics}))
    return tmp_path


def test_critical_rank_split_by_hand(tmp_path):
    (row,) = R.critical_rounds(_write(tmp_path))  # round 1 skipped
    assert row["rank"] == 1 and row["units"] == 10.0 and row["compute_ops"] == 4
    assert row["round"] == pytest.approx(0.020)
    assert row["swap in + out"] == pytest.approx(0.0005)
    assert row["agent steps (forward+backward, optimizer)"] == pytest.approx(0.012)
    assert row[R.GATHER_ROW] == pytest.approx(0.005)
    assert row["fusion"] == pytest.approx(0.0005)
    assert row[R.BETWEEN] == pytest.approx(0.020 - 0.018)  # 22.5-24 and 29.5-30 ms


def test_simulated_host_overhead_moves_to_between_ops(tmp_path):
    """The simulator adds its host overhead to every Compute span; the split moves it to
    "between ops", where the real run's Python time shows: 4 ops x 0.1 ms."""
    (row,) = R.critical_rounds(_write(tmp_path), host_s=1e-4)
    assert row["agent steps (forward+backward, optimizer)"] == pytest.approx(0.012 - 2e-4)
    assert row[R.BETWEEN] == pytest.approx(0.002 + 4e-4)
    assert row["round"] == pytest.approx(0.020)


def test_plan_units_price_the_critical_rank_at_the_planned_median(tmp_path):
    """Metered: round 1's agents used 1 and 2 ms per unit (median 1.5 ms, the price round 2
    is planned at); in round 2 the critical rank's agent used 12 ms of device time in 10
    steps, cheaper than that price: the simulator hands it 12 / 1.5 = 8 units for those
    seconds, not the 10 steps it ran."""
    run = _write(tmp_path)
    report = json.loads((run / "report.json").read_text())
    for r, (first, second) in {"0": (0.004, 0.003), "1": (0.008, 0.012)}.items():
        report["metrics"][r][0][f"device_s.{r}"] = first
        report["metrics"][r][1][f"device_s.{r}"] = second
    (run / "report.json").write_text(json.dumps(report))
    (row,) = R.critical_rounds(run)
    assert row["rank"] == 1 and row["units"] == 10.0
    assert row["device_s"] == pytest.approx(0.012)
    assert row["plan_unit_s"] == pytest.approx(0.0015)
    assert R.median_unit_s(report, 1) == pytest.approx((0.003 / 3 + 0.012 / 10) / 2)
    assert R.plan_units(row) == pytest.approx(8.0)


def test_plan_units_fall_back_to_units_without_device_time(tmp_path):
    (row,) = R.critical_rounds(_write(tmp_path))  # device_s 0: nothing metered
    assert R.plan_units(row) == 10.0
