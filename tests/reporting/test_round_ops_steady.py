"""oresearcher.reporting.round_ops.steady: the steady figures of a real run (steps after the first
two: the slowest rank's step, the mean over ranks of the time blocked in communication,
their ratio), which both sim-to-real chains compare with the simulator, on a hand-made
report and trace."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oresearcher.errors import UserError
from oresearcher.reporting.round_ops import rank_split, steady


def _run(tmp_path: Path, ends: dict, blocked: dict, compute: dict | None = None) -> tuple[dict, Path]:
    """A run directory: per-rank step ends (s), blocked spans and compute spans (start s,
    length s)."""
    steps = len(next(iter(ends.values())))
    ev = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": t, "args": {"name": f"rank {r} {lane}"}}
          for t, (r, lane) in enumerate((r, lane) for r in ends for lane in ("compute", "blocked"))]
    tid = {e["args"]["name"]: e["tid"] for e in ev}
    for r, spans in blocked.items():
        ev += [{"ph": "X", "name": "blocked:grads", "pid": 0, "tid": tid[f"rank {r} blocked"],
                "ts": s * 1e6, "dur": d * 1e6} for s, d in spans]
    for r, spans in (compute or {}).items():
        ev += [{"ph": "X", "name": "fwd_bwd", "pid": 0, "tid": tid[f"rank {r} compute"],
                "ts": s * 1e6, "dur": d * 1e6} for s, d in spans]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": ev}))
    total = {r: sum(d for _, d in spans) for r, spans in blocked.items()}
    exposed = sum(total.values()) / len(total) / steps
    report = {"step_time_s": max(t[-1] for t in ends.values()) / steps, "exposed_comm_time_s": exposed,
              "metrics": {r: [{"time_s": t} for t in ts] for r, ts in ends.items()}}
    report["comm_overhead"] = exposed / report["step_time_s"]
    return report, tmp_path


def test_steady_figures_leave_out_the_first_two_steps(tmp_path):
    # rank 0: a 0.3 s first step, then 0.1 s steps; rank 1: 0.12 s steps after its second.
    # Blocked: rank 0 0.05 s in step 1 (a first collective's connection), then 0.01 s a
    # step; rank 1 0.02 s a step after its second.
    ends = {"0": [0.3, 0.4, 0.5, 0.6, 0.7], "1": [0.3, 0.42, 0.54, 0.66, 0.78]}
    blocked = {"0": [(0.2, 0.05), (0.35, 0.01), (0.45, 0.01), (0.55, 0.01), (0.65, 0.01)],
               "1": [(0.35, 0.01), (0.5, 0.02), (0.6, 0.02), (0.7, 0.02)]}
    report, run = _run(tmp_path, ends, blocked)
    got = steady(report, run)
    step = (0.78 - 0.42) / 3  # the slowest rank, steps 3..5
    exposed = (0.03 / 3 + 0.06 / 3) / 2  # blocked after each rank's second step end, per step, mean of ranks
    assert got["step_time_s"] == pytest.approx(step)
    assert got["exposed_comm_time_s"] == pytest.approx(exposed)
    assert got["comm_overhead"] == pytest.approx(exposed / step)
    assert got["first_steps_step_time_s"] == pytest.approx(0.78 / 5)
    assert got["first_steps_comm_overhead"] == pytest.approx(report["comm_overhead"])
    assert report["step_time_s"] == pytest.approx(0.78 / 5)  # the report itself is left alone


def test_steady_figures_need_steps_past_the_warmup(tmp_path):
    report, run = _run(tmp_path, {"0": [0.3, 0.4]}, {"0": []})
    with pytest.raises(UserError, match="more than 2 steps"):
        steady(report, run)


def test_compute_per_rank_counts_the_steady_steps_only(tmp_path):
    # rank 0 computes 0.08 s a step, rank 1 0.1 s; both 0.2 s in their first step
    ends = {"0": [0.3, 0.4, 0.5, 0.6, 0.7], "1": [0.3, 0.4, 0.5, 0.6, 0.7]}
    compute = {r: [(0.0, 0.2)] + [(0.3 + 0.1 * k, d) for k in range(4)] for r, d in (("0", 0.08), ("1", 0.1))}
    report, run = _run(tmp_path, ends, {"0": [], "1": []}, compute)
    got = steady(report, run)["compute_s_by_rank"]
    # steps 3..5 start after the second step's end (0.4 s): the spans at 0.4, 0.5, 0.6
    assert got["0"] == pytest.approx(0.08) and got["1"] == pytest.approx(0.1)
    assert rank_split(got) == pytest.approx(0.02 / 0.09)


def test_rank_split_is_zero_for_one_rank_or_equal_ranks():
    assert rank_split([0.05]) == 0.0
    assert rank_split({"0": 0.05, "1": 0.05}) == 0.0
    assert rank_split([0.0, 0.0]) == 0.0
    assert rank_split([0.04, 0.05, 0.06]) == pytest.approx(0.4)
