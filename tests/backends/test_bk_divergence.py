"""Divergence on torch.distributed (gloo, 2 ranks): rank 1's gradient turns NaN at step 3.

Policy stop: the run ends with one line naming the rank and the step, before the NaN is
shared (rank 0 never applies it), and exit code 2 (a user-facing stop, as in the simulator),
also when the world is that one rank. Policy skip: the run finishes, the step's average is
over the healthy rank, both ranks end with the same finite parameters; with every rank's
gradient NaN the run stops with one summary line and exit code 2."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import torch

from bk_helpers import REPO, write_scenario
from oresearcher.backends.checkpoint import per_rank as ckpt

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
    assert [m["diverged"] for m in rep["metrics"]["1"] if "diverged" in m][-1] == 1.0

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


# ---- fsdp: FSDP2 reduce-scatters inside backward; the check sits in its reduce-scatter ----------
def _fsdp_run(tmp_path, env, policy, who="1"):
    import yaml

    data = yaml.safe_load((REPO / "scenarios" / "cpu-fsdp.yaml").read_text())
    data["agents"]["count"] = 2
    data["training"] = {**data["training"], "steps": 6, "checkpoint_every": 1, "on_divergence": policy}
    sc = tmp_path / f"fsdp-{policy}.yaml"
    sc.write_text(yaml.safe_dump(data))
    out = tmp_path / f"fsdp-{policy}-{who}"
    p = subprocess.run([*RUN[:-1], "bk_poison:make_nan_fsdp_learner", "--keep_checkpoints", "0",
                        "--scenario", str(sc), "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=180, env=dict(env, POISON_RANK=who, POISON_STEP="3"))
    return p, out


def _dcp(out, step, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = tmp_path / f"dcp-{step}.pt"
    dcp_to_torch_save(ckpt.step_dir(out, step) / "dcp", path)
    flat = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}", x)
        elif isinstance(v, torch.Tensor):
            flat[prefix] = v
    walk("", torch.load(path, weights_only=False))
    return flat


def test_fsdp_stop_names_the_rank_and_skip_drops_the_step_on_every_rank(tmp_path, child_env):
    p, out = _fsdp_run(tmp_path, child_env, "stop")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert lines[0].startswith("error: rank 1 diverged at step 3: non-finite gradient (training.lr=0.003); "
                               "stopped before it was shared"), lines
    assert "'skip' drops the step on every rank)" in lines[0], lines  # what skip does under fsdp
    assert "the other ranks stopped (last complete checkpoint: step 2" in lines[0]
    assert ckpt.newest_complete(out, 2) == 2 and not (out / "report.json").exists()

    p, out = _fsdp_run(tmp_path, child_env, "skip")
    assert p.returncode == 0, p.stderr[-3000:]
    assert ("rank 1: non-finite values at step 3; the step is skipped on every rank (fsdp) (1 of 2 ranks healthy)"
            in p.stderr)
    before, skipped, after = (_dcp(out, s, tmp_path) for s in (2, 3, 4))
    assert before.keys() == skipped.keys() and len(before) > 10
    for k, v in before.items():  # the NaN never reached rank 0: nothing moved at step 3, on any shard
        assert torch.equal(v, skipped[k]) and bool(torch.isfinite(v).all()), k
    assert any(not torch.equal(v, after[k]) for k, v in skipped.items())  # and training went on
    rep = json.loads((out / "report.json").read_text())
    assert [m.get("diverged") for m in rep["metrics"]["1"]][3] == 1.0
    assert all(math.isfinite(m["loss"]) for r in ("0", "1") for m in rep["metrics"][r])
