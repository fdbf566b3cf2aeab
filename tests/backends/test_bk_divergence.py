"""Divergence on torch.distributed (gloo, 2 ranks): rank 1's gradient turns NaN at step 3.

Policy stop: the run ends with one line naming the rank and the step, before the NaN is
shared (rank 0 never applies it), and exit code 2 (a user-facing stop, as in the simulator),
also when the world is that one rank. Policy skip: the run finishes, the step's average is
over the healthy rank, both ranks end with the same finite parameters; with every rank's
gradient NaN the run stops with one summary line and exit code 2."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from bk_helpers import REPO, write_scenario
from oresearcher.backends import checkpoint as ckpt

RUN = [sys.executable, "-m", "oresearcher.run", "--no-tensorboard", "--no-progress", "--timeout", "30",
       "--log-level", "WARNING", "--learner", "bk_poison:make_nan_learner"]


def _run(tmp_path, env, policy, who="1", world=2):
    sc = write_scenario(tmp_path / f"{policy}.yaml", agents={"count": world},
                        training={"steps": 6, "checkpoint_every": 6, "on_divergence": policy})
    out = tmp_path / f"{policy}-{who}-{world}"
    p = subprocess.run([*RUN, "--scenario", str(sc), "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env=dict(env, POISON_RANK=who, POISON_STEP="3"))
    return p, out


def test_gloo_stop_is_one_line_and_skip_leaves_the_rank_out(tmp_path, child_env):
    p, out = _run(tmp_path, child_env, "stop")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("error: rank 1 diverged at step 3: non-finite gradient"), p.stderr
    assert lines[0].endswith("; the other ranks stopped (no complete checkpoint to resume from)"), p.stderr
    assert "Traceback" not in p.stderr and not (out / "report.json").exists()

    p, out = _run(tmp_path, child_env, "skip")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "rank 1: non-finite values at step 3; its contribution is skipped (1 of 2 ranks healthy)" in p.stderr
    params = [ckpt.load(ckpt.rank_file(out, 5, r))["learner"]["module"] for r in (0, 1)]
    for k, v in params[0].items():
        assert torch.equal(v, params[1][k]) and bool(torch.isfinite(v).all())
    rep = json.loads((out / "report.json").read_text())
    assert rep["final_metrics"]["diverged"] == 1.0  # rank 1 only: the metric's mean over ranks of their last value

    p, out = _run(tmp_path, child_env, "skip", who="all")  # nothing healthy left: rank 0 says so, once
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert lines == ["error: every agent is excluded at step 3: all 2 ranks had non-finite gradients; nothing "
                     "healthy is left to train from (training.lr=0.1: lower it, or resume from an earlier checkpoint)"]


def test_gloo_stop_of_a_single_rank_world_is_one_line_and_exit_2(tmp_path, child_env):
    p, out = _run(tmp_path, child_env, "stop", who="0", world=1)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: rank 0 diverged at step 3: non-finite gradient (training.lr=0.1); stopped before it was shared "
        "(training.on_divergence: stop; 'skip' leaves the rank out and restores it)"], p.stderr
    assert not (out / "report.json").exists()
