"""Hosted agents on gloo: 8 agents on 4 ranks (2 each), device time handed out by
shares (oresearcher.cooperation.scheduler).

What the schedule hands out is exact: the units each agent ran (whole steps, credit
carried) match its shares within 5%, and equal the simulator's for the same scenario.
The device time each agent used (CPU time of its slices, from the second round on: the
first includes warm-up) is measured too, but on this oversubscribed 2-core VM the time
per unit of a slice varies by about 10% with the neighbours' load, and now and then one
slice stalls 3-6x (README: "Device time by shares"). Slices slower per unit than 2x their
rank's median count at that cap (at most 5% of them may), and the time is held to 20%: a
bound that still catches a schedule handing out the wrong time (shares differ 2-5x)."""
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
    for a in range(8):
        assert abs(units[a] - given[a]) <= 0.05 * given[a], (a, units, given)
    used, given_t, capped = device_time_vs_shares(report, skip_rounds=1, burst=2.0)
    assert capped <= 0.05
    for a in range(8):
        assert abs(used[a] - given_t[a]) <= 0.20 * given_t[a], (a, used, given_t)
