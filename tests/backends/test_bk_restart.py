"""torchrun --max-restarts (gloo, 2 ranks): a rank killed mid-run (SIGKILL, as a lost GPU)
is restarted by the elastic agent, and the restarted attempt resumes from the newest
checkpoint by itself; it ends where an uninterrupted run ends, bit for bit."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

import yaml

from bk_helpers import REPO
from oresearcher.backends.checkpoint import per_rank as ckpt

ARGS = ["-m", "oresearcher.run", "--no-tensorboard", "--no-progress", "--timeout", "30", "--log-level", "WARNING"]


def _scenario(path):
    data = yaml.safe_load((REPO / "scenarios" / "digits-4.yaml").read_text())
    data["agents"] = {**data["agents"], "count": 2, "roles": None}
    data["cluster"] = {**data["cluster"], "gpus_per_node": 2}
    data["training"] = {**data["training"], "strategy": "ddp", "steps": 12, "checkpoint_every": 3}
    path.write_text(yaml.safe_dump(data))
    return path


def test_torchrun_restart_resumes_from_the_newest_checkpoint(tmp_path, child_env):
    sc = _scenario(tmp_path / "s.yaml")
    out, ref = tmp_path / "run", tmp_path / "ref"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=1"]
    p = subprocess.run([*torchrun, *ARGS, "--scenario", str(sc), "--out", str(out),
                        "--learner", "bk_poison:make_dying_learner"], cwd=REPO, capture_output=True, text=True,
                       timeout=240, env=dict(child_env, DIE_RANK="1", DIE_STEP="7"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "exitcode: -9" in p.stderr and "torchrun restart 1: resuming" in p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["start_step"] == 6 and rep["steps"] == 6  # checkpoint of step 5, the newest before the kill at 7

    p = subprocess.run([sys.executable, *ARGS, "--scenario", str(sc), "--out", str(ref)], cwd=REPO, capture_output=True, text=True, timeout=240, env=child_env)
    assert p.returncode == 0, p.stderr[-2000:]
    for r in (0, 1):
        got, want = (ckpt.load(ckpt.rank_file(d, 11, r))["learner"] for d in (out, ref))
        for k, v in want["module"].items():
            assert torch.equal(got["module"][k], v), (r, k)
