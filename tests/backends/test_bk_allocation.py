"""Hosted agents on gloo: 8 agents on 4 ranks (2 each), device time handed out by
shares (oresearcher.cooperation.scheduler).

The scheduler meters device time: from the first measured round the plan is in seconds
and the credit carried is what each agent really used (a CPU rank's device is its core:
the CPU time of its steps, SliceClock). What a test can hold exactly is the books, from
the report alone: for every agent the seconds handed out less the seconds used are its
credit plus what the clamp dropped. The units run are no longer proportional to the
shares (a step costs more CPU time while four ranks share the 2 cores than alone, and
the metering gives the agents that run then fewer steps). How close the device time
comes to the shares is a timing figure: benchmarks/bench_allocation.py prints it, this
test does not assert it. The simulator, with equal devices, meets 5%
(tests/cooperation/test_allocation_hosted.py)."""
from __future__ import annotations

import json
import subprocess
import sys

from bk_helpers import REPO
from oresearcher.programs.cooperative_hosted import device_time_vs_shares

SETS = ["training.steps=300", "communication.interval=20"]


def units_vs_shares(report):
    first = report["metrics"]["0"]
    n = sum(1 for k in first[0] if k.startswith("target."))
    units = [sum(m[f"units.{a}"] for m in first) for a in range(n)]
    given = [sum(m[f"target.{a}"] for m in first) for a in range(n)]
    return [u / sum(units) for u in units], [g / sum(given) for g in given]


def test_gloo_hosted_agents_get_their_shares(tmp_path, child_env):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--scenario",
           str(REPO / "scenarios" / "alloc-8on4.yaml"), "--out", str(out)]
    for s in SETS:
        cmd += ["--set", s]
    p = subprocess.run(cmd, cwd=REPO, env=child_env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert len(report["metrics"]) == 4
    units, given = units_vs_shares(report)
    assert max(given) > 1.5 * min(given)  # time really moved between agents
    # Metered (scheduler.settle): the seconds handed out, less the seconds used, are the
    # credit plus what the clamp dropped, exactly, from the report alone; the units run
    # move away from the shares by what the steps cost, so they are not held to them.
    first = report["metrics"]["0"]
    assert all(m["target_in_seconds"] == 1.0 for m in first)
    for per_rank in report["metrics"].values():
        for a in {int(key.split(".")[1]) for key in per_rank[0] if key.startswith("device_s.")}:
            handed = sum(m[f"target.{a}"] for m in first)
            used = sum(m[f"device_s.{a}"] for m in per_rank)
            books = per_rank[-1][f"credit.{a}"] + per_rank[-1][f"dropped.{a}"]
            assert abs(handed - used - books) <= 1e-9 * handed, (a, handed, used, books)
    # The measured device time is a timing figure: it depends on this host's load, so it
    # is printed by benchmarks/bench_allocation.py, not asserted here (it flips under CI
    # load). What a test can hold is that it is measured for every agent.
    used, given_t, _ = device_time_vs_shares(report, skip_rounds=1, key="steady_s")
    assert len(used) == len(given_t) == 8 and all(u > 0 for u in used), used
    for per_rank in report["metrics"].values():  # CPU time of one thread: within the slice's wall time
        for m in per_rank:
            mine = [key.split(".")[1] for key in m if key.startswith("device_s.")]
            assert len(mine) == 2
            for a in mine:
                assert 0 <= m[f"device_s.{a}"] <= m[f"wall_s.{a}"] + 1e-3, (a, m)
                # measured where steps ran; a metered slice whose agent has spent its credit runs none
                assert (m[f"device_s.{a}"] > 0) == (m[f"units.{a}"] > 0), (a, m)
