"""Nothing a run computed is lost, nothing it did not write is touched (gloo, 2 ranks).

Kills happen at named points of the run (tests/backends/bk_kill.py), never after a
sleep: after the final checkpoint but before the report (the local launcher, and a
torchrun restart), which the resume turns into the report the uninterrupted run writes.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bk_helpers import REPO, write_scenario
from oresearcher.backends.checkpoint import per_rank as ckpt
from oresearcher.backends.run import rundir

RUN = ["-m", "oresearcher.run", "--no-tensorboard", "--no-progress", "--timeout", "30", "--log-level", "WARNING",
       "--learner", "bk_kill:make_learner"]
STEPS = 6


def run(args, env, torchrun=False):
    pre = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=1"] if torchrun else [sys.executable]
    return subprocess.run([*pre, *RUN, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def same_result(got: dict, want: dict) -> None:
    """Reports of one training: the same steps and, per rank, the same metrics at every step
    (times are measurements of this host, not results)."""
    assert got["steps"] == want["steps"] == STEPS and got["world_size"] == want["world_size"]
    assert got["final"] == want["final"]
    for r in want["metrics"]:
        assert [{k: v for k, v in m.items() if k != "time_s"} for m in got["metrics"][r]] == \
               [{k: v for k, v in m.items() if k != "time_s"} for m in want["metrics"][r]], r


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every recovered one must equal."""
    from bk_helpers import child_environment

    d = tmp_path_factory.mktemp("ref")
    sc = write_scenario(d / "s.yaml", training={"steps": STEPS, "checkpoint_every": 2})
    p = run(["--scenario", str(sc), "--out", str(d / "run")], child_environment())
    assert p.returncode == 0, p.stderr[-3000:]
    return sc, json.loads((d / "run" / "report.json").read_text())


def test_killed_before_the_report_the_resume_writes_it_from_the_final_checkpoints(tmp_path, child_env, reference):
    sc, want = reference
    out = tmp_path / "run"
    p = run(["--scenario", str(sc), "--out", str(out)], dict(child_env, KILL_RANK="0", KILL_AT="report"))
    assert p.returncode == 1 and "rank 0 lost (killed by SIGKILL)" in p.stderr, p.stderr[-3000:]
    assert ckpt.newest_complete(out, 2) == STEPS - 1 and not (out / "report.json").exists()
    p = run(["--resume", str(out)], child_env)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    same_result(json.loads((out / "report.json").read_text()), want)
    assert rundir.finished(out)["steps"] == STEPS  # a later --resume: finished, with its steps


def test_torchrun_restart_after_the_final_checkpoint_writes_the_whole_report(tmp_path, child_env, reference):
    sc, want = reference
    out = tmp_path / "run"
    p = run(["--scenario", str(sc), "--out", str(out), "--checkpoint_every", "1"],
            dict(child_env, KILL_RANK="1", KILL_AT=f"saved:{STEPS - 1}"), torchrun=True)
    assert p.returncode == 0 and "exitcode: -9" in p.stderr and "Traceback" not in p.stderr.split("exitcode: -9")[1], \
        p.stderr[-3000:]
    same_result(json.loads((out / "report.json").read_text()), want)
    assert rundir.finished(out)["steps"] == STEPS


@pytest.mark.parametrize("at, code, words", [
    ("full", 2, "cannot write checkpoint step 3: the disk is full (no space left on the device); the checkpoints "
                "before it are intact"),
    ("sigint", 1, "rank 1 lost (killed by SIGINT)"),
])
def test_a_full_disk_or_a_sigint_mid_save_is_one_line_and_the_earlier_checkpoint_survives(tmp_path, child_env,
                                                                                          reference, at, code, words):
    sc, _ = reference
    out = tmp_path / "run"
    p = run(["--scenario", str(sc), "--out", str(out), "--keep_checkpoints", "0"],
            dict(child_env, KILL_RANK="1", KILL_AT=f"{at}:3"))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == code and len(lines) <= 3 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert words in lines[-1] and f"--resume {out}" in lines[-1], lines
    assert ckpt.invalid(out, 1, 0) is None and ckpt.invalid(out, 1, 1) is None  # step 1's checkpoint, intact
