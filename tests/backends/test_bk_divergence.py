"""Divergence on torch.distributed (gloo, 2 ranks): rank 1's gradient turns NaN at step 3.

Policy stop: the run ends with one line naming the rank and the step, before the NaN is
shared (rank 0 never applies it). Policy skip: the run finishes, the step's average is
over the healthy rank, both ranks end with the same finite parameters."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from bk_helpers import REPO, write_scenario
from oresearcher.backends import checkpoint as ckpt

RUN = [sys.executable, "-m", "oresearcher.run", "--no-tensorboard", "--no-progress", "--timeout", "30",
       "--log-level", "WARNING", "--learner", "bk_poison:make_nan_learner"]


def _run(tmp_path, env, policy):
    sc = write_scenario(tmp_path / f"{policy}.yaml", training={"steps": 6, "checkpoint_every": 6,
                                                               "on_divergence": policy})
    out = tmp_path / policy
    p = subprocess.run([*RUN, "--scenario", str(sc), "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env=dict(env, POISON_RANK="1", POISON_STEP="3"))
    return p, out


def test_gloo_stop_is_one_line_and_skip_leaves_the_rank_out(tmp_path, child_env):
    p, out = _run(tmp_path, child_env, "stop")
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and last.startswith("error: rank 1 diverged at step 3: non-finite gradient"), p.stderr
    assert "Traceback" not in p.stderr and not (out / "report.json").exists()

    p, out = _run(tmp_path, child_env, "skip")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "rank 1: non-finite values at step 3; its contribution is skipped (1 of 2 ranks healthy)" in p.stderr
    params = [ckpt.load(ckpt.rank_file(out, 5, r))["learner"]["module"] for r in (0, 1)]
    for k, v in params[0].items():
        assert torch.equal(v, params[1][k]) and bool(torch.isfinite(v).all())
    rep = json.loads((out / "report.json").read_text())
    assert rep["final_metrics"]["diverged"] == 1.0  # rank 1 only: the metric's mean over ranks of their last value
