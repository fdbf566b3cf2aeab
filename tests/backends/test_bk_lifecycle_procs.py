"""The run lifecycle's attacks with real processes (gloo, 2 ranks): a damaged newest
checkpoint and an lr --override on resume, SIGINT/SIGTERM of the launcher, and two runs
started into one directory at once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bk_helpers import REPO, write_scenario
from oresearcher.backends.checkpoint import per_rank as ckpt
from oresearcher.backends.run import rundir

RUN = [sys.executable, "-m", "oresearcher.run", "--no-tensorboard", "--no-progress", "--timeout", "30"]
TINY, SLOW = "bk_tiny:make_learner", "bk_tiny:make_slow_learner"


def run(args, env, timeout=120):
    return subprocess.run([*RUN, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _lr(out, step, rank):
    return ckpt.load(ckpt.rank_file(out, step, rank))["learner"]["optimizer"]["param_groups"][0]["lr"]


def test_resume_skips_a_corrupt_newest_checkpoint_and_override_changes_the_lr_for_real(tmp_path, child_env):
    sc = write_scenario(tmp_path / "s.yaml", training={"steps": 12, "checkpoint_every": 4, "lr": 0.1})
    out = tmp_path / "run"
    p = run(["--scenario", str(sc), "--learner", TINY, "--out", str(out), "--keep_checkpoints", "0"], child_env)
    assert p.returncode == 0, p.stderr[-2000:]
    (out / "report.json").unlink()  # as if it had stopped after its last checkpoint
    path = ckpt.rank_file(out, 11, 1)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a disk that filled up

    p = run(["--resume", str(out), "--learner", TINY, "--steps", "16", "--lr", "0.5"], child_env)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: --resume: training.lr")
    p = run(["--resume", str(out), "--learner", TINY, "--steps", "16", "--lr", "0.5", "--override",
             "--keep_checkpoints", "0"], child_env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "checkpoint step 11 skipped: rank 1: rank-0001.pt has" in p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["start_step"] == 8 and rep["steps"] == 8 and rep["scenario"]["training"]["lr"] == 0.5
    assert _lr(out, 7, 0) == 0.1 and _lr(out, 15, 0) == 0.5 and _lr(out, 15, 1) == 0.5
    assert ckpt.invalid(out, 11, 1) is None  # step 11 was trained again and saved intact

    before = (out / "report.json").read_bytes()
    p = run(["--resume", str(out), "--learner", TINY], child_env)
    assert p.returncode == 0 and "the run finished (8 steps); nothing to resume" in p.stdout
    assert (out / "report.json").read_bytes() == before


def _start_slow(sc, out, env, *extra):
    return subprocess.Popen([*RUN, "--scenario", str(sc), "--learner", SLOW, "--out", str(out),
                             "--log-level", "WARNING", *extra], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(out, proc, deadline_s=60.0) -> int:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        step = ckpt.newest_complete(out, 2)
        if step is not None:
            return step
        time.sleep(0.1)
    raise AssertionError(f"no complete checkpoint appeared (exit code {proc.poll()})")


def _eventually(condition, deadline_s=30.0) -> bool:
    """Poll ``condition`` until it holds or ``deadline_s`` passes (a loaded host is slow, not wrong)."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_stops_the_run_in_one_line_and_leaves_no_temp_files(sig, tmp_path, child_env):
    sc = write_scenario(tmp_path / "s.yaml", training={"steps": 5000, "checkpoint_every": 3})
    out = tmp_path / "run"
    proc = _start_slow(sc, out, dict(child_env, TINY_SLEEP_S="0.02"))
    try:
        step = _wait_for_checkpoint(out, proc)
        tmp = ckpt.step_dir(out, step) / ".rank-0000.pt.tmp-999999"
        tmp.write_bytes(b"x" * 1000)  # what a rank killed mid-save leaves
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 128 + sig, err
    assert len(lines) <= 3 and "Traceback" not in err and "terminate called" not in err, err
    assert lines[-1].startswith(f"error: stopped by {sig.name}") and f"--resume {out}" in lines[-1]
    assert not list((out / "checkpoints").glob("step-*/.*tmp-*"))
    assert not (out / rundir.LOCK).exists()
    assert _eventually(lambda: ckpt.newest_complete(out, 2) is not None), "no complete checkpoint after the stop"
    assert not (out / "report.json").exists()


def test_two_runs_into_one_directory_at_once_one_refuses(tmp_path, child_env):
    sc = write_scenario(tmp_path / "s.yaml", training={"steps": 5000, "checkpoint_every": 3})
    out = tmp_path / "run"
    first = _start_slow(sc, out, dict(child_env, TINY_SLEEP_S="0.02"))
    try:
        _wait_for_checkpoint(out, first)
        t0 = time.monotonic()
        second = run(["--scenario", str(sc), "--learner", TINY, "--out", str(out), "--overwrite"], child_env)
        assert time.monotonic() - t0 < 60  # refused at once, not after the first run: a hang check, not a timing
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"in use by a running run (pid {first.pid})" in lines[0], lines
    assert ckpt.newest_complete(out, 2) is not None  # --overwrite did not touch the live run


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds child ranks through /proc")
def test_a_frozen_rank_is_named_within_the_timeout_and_the_run_resumes(tmp_path, child_env):
    """SIGSTOP of rank 1 (a hung GPU, a swapped-out host): it neither dies nor answers.
    Rank 0's monitor names it once its heartbeat is --timeout old, and the run stops with
    one line that says where to resume from; the resume finishes (ORESEARCHER_SLOW_TESTS=1)."""
    from bk_helpers import child_with_rank

    sc = write_scenario(tmp_path / "s.yaml", training={"steps": 5000, "checkpoint_every": 3})
    out = tmp_path / "run"
    proc = subprocess.Popen([*RUN[:-2], "--timeout", "5", "--scenario", str(sc), "--learner", SLOW, "--out", str(out),
                             "--log-level", "WARNING"], cwd=REPO, env=dict(child_env, TINY_SLEEP_S="0.02"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen = None
    try:
        _wait_for_checkpoint(out, proc)
        frozen = child_with_rank(proc.pid, 1)
        os.kill(frozen, signal.SIGSTOP)
        _, err = proc.communicate(timeout=60)  # a hang check: the timeout is 5 s
    finally:
        if proc.poll() is None:
            proc.kill()
        if frozen is not None:
            try:
                os.kill(frozen, signal.SIGKILL)
            except ProcessLookupError:
                pass
    lines = err.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    step = ckpt.newest_complete(out, 2)
    assert lines[-1].startswith("error: rank 1 lost: no heartbeat for ") and lines[-1].endswith(
        f"the other ranks stopped (last complete checkpoint: step {step}; resume with --resume {out})"), lines
    assert not (out / rundir.LOCK).exists() and not (out / "report.json").exists()
    if os.environ.get("ORESEARCHER_SLOW_TESTS") != "1":  # resuming after a kill: test_bk_cli, every run
        return
    p = run(["--resume", str(out), "--learner", TINY, "--steps", str(step + 3), "--log-level", "WARNING"], child_env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((out / "report.json").read_text())["start_step"] == step + 1


def test_a_report_slower_than_the_timeout_is_no_lost_rank(tmp_path, child_env):
    """Rank 0 writes the report (figures included) for longer than --timeout while rank 1
    waits: the run finishes (exit 0), it does not end in a process-group timeout.

    --timeout also bounds the rendezvous and every collective of the run: 6 s leaves a
    loaded 2-core host room to start and step both ranks (2 s did not, now and then); the
    report then takes the timeout and 4 s more, so rank 1 waits well past it."""
    timeout_s = 6.0
    sc = write_scenario(tmp_path / "s.yaml", training={"steps": 4, "checkpoint_every": 0})
    out = tmp_path / "run"
    p = run(["--scenario", str(sc), "--learner", "bk_tiny:make_slow_report_learner", "--out", str(out),
             "--timeout", f"{timeout_s:g}", "--log-level", "WARNING"],
            dict(child_env, REPORT_SLEEP_S=f"{timeout_s + 4:g}"))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert json.loads((out / "report.json").read_text())["steps"] == 4
