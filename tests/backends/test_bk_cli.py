"""End to end through the command lines: `python -m oresearcher.run` on local gloo ranks
(report, trace, TensorBoard, profiler, checkpoints), a rank killed mid-run and the run
resumed, torchrun-style joining, `oresearcher.calibrate`, and the one-line errors."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bk_helpers import REPO, write_scenario
from bk_helpers import child_with_rank as _child_with_rank
from oresearcher.backends.checkpoint import per_rank as ckpt
from oresearcher.reporting.report import REPORT_KEYS

RUN = [sys.executable, "-m", "oresearcher.run"]
TINY = "bk_tiny:make_learner"


def run(args, env, timeout=120):
    return subprocess.run([*RUN, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _wait_for_checkpoint(out: Path, proc, ranks=(0, 1), deadline_s=60.0) -> int:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        step = ckpt.latest_common([ckpt.steps_held(out, r) for r in ranks])
        if step is not None:
            return step
        time.sleep(0.1)
    raise AssertionError(f"no complete checkpoint appeared (exit code {proc.poll()})")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds child ranks through /proc")
def test_killed_rank_stops_the_run_and_the_run_resumes(tmp_path, child_env):
    sc = write_scenario(tmp_path / "s.yaml", training={"steps": 2000, "checkpoint_every": 3})
    out = tmp_path / "run"
    env = dict(child_env, TINY_SLEEP_S="0.02")
    proc = subprocess.Popen([*RUN, "--scenario", str(sc), "--learner", "bk_tiny:make_slow_learner", "--out", str(out),
                             "--timeout", "20", "--no-tensorboard"], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_checkpoint(out, proc)
        os.kill(_child_with_rank(proc.pid, 1), signal.SIGKILL)
        _, err = proc.communicate(timeout=40)  # the survivors stop well within the timeout
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: rank 1 lost (killed by SIGKILL)") and f"--resume {out}" in last, err
    assert "rank0 ERROR" in err and "rank 1 lost" in err  # the survivor names the lost rank too
    step = ckpt.latest_common([ckpt.steps_held(out, r) for r in (0, 1)])
    assert f"last complete checkpoint: step {step}" in last

    # resume (switching to local_sgd on purpose: --override) with everything on
    total = step + 1 + 4
    p = run(["--resume", str(out), "--learner", TINY, "--steps", str(total), "--strategy", "local_sgd",
             "--override", "--profile"], child_env)
    assert p.returncode == 0, p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert set(REPORT_KEYS) <= set(rep) and rep["backend"] == "gloo" and rep["world_size"] == 2
    assert rep["start_step"] == step + 1 and rep["steps"] == 4 and rep["strategy"] == "local_sgd"
    assert [m["step"] for m in rep["metrics"]["1"]] == list(range(step + 1, total))
    assert [(b["name"], b["count"]) for b in rep["breakdown"]] == [("param_average", 2)]  # H=3 in 4 steps, 2 ranks
    assert rep["final"]["deployable"]["value"] > 0 and "final_metrics" not in rep
    assert json.loads((out / "trace.json").read_text())["traceEvents"]
    for r in (0, 1):
        assert list((out / "tensorboard" / f"agent{r}").glob("events.out.tfevents.*"))
    assert list((out / "tensorboard" / "profile").glob("rank*.pt.trace.json*"))
    assert ckpt.latest_common([ckpt.steps_held(out, r) for r in (0, 1)]) == total - 1  # the last step
    state = ckpt.load(ckpt.rank_file(out, total - 1, 1))
    assert state["step"] == total - 1 and state["world_size"] == 2 and "module" in state["learner"]


def test_calibrate_writes_a_profile_the_simulator_loads(tmp_path, child_env):
    from oresearcher.hardware import load_profile_file

    sc = write_scenario(tmp_path / "s.yaml")
    prof = tmp_path / "p.yaml"
    p = subprocess.run([sys.executable, "-m", "oresearcher.calibrate", "--scenario", str(sc), "--learner", TINY,
                        "--out", str(prof), "--max-bytes", "2e6", "--repeats", "1", "--compute-steps", "1"],
                       cwd=REPO, env=child_env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    dev, fab = load_profile_file(prof)
    assert (dev.name, fab.name) == ("cpu-calibrated", "gloo-calibrated")
    assert dev.flops_per_s("fp32") > 0 and fab.bandwidth > 0
    text = prof.read_text()
    sizes = {int(line.split()[2]) for line in text.splitlines() if line.startswith("#   AllReduce")}
    # the sweep, plus the workload's sizes; it reaches 1 MiB, where transfer outweighs a loaded host's noise
    # (up to a few KiB alone, a busy host's milliseconds made the fitted bandwidth ~0.0003 GB/s: refused)
    assert "gloo with 2 ranks" in text and {1024, 4096, 16384, 65536, 262144, 1048576} < sizes


@pytest.mark.parametrize("args, words", [
    (["--backend=nccl"], "needs CUDA"),
    (["--scenario", "nope.yaml"], "nope.yaml: no such file"),
    (["--num_agents", "0"], "agents.count"),
    (["--reward_weights", "0,0,0"], "reward weights"),
    (["--resume", "no/such/run"], "no such run directory"),
])
def test_user_mistakes_give_one_line_and_exit_2(args, words, tmp_path, capsys, monkeypatch):
    from oresearcher.errors import cli_main
    from oresearcher.run import main

    if "nccl" in args[0] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    sc = write_scenario(tmp_path / "s.yaml")
    assert cli_main(main, args if "--scenario" in args else ["--scenario", str(sc), *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines


def test_world_size_from_torchrun_must_match_the_scenario(tmp_path, capsys, monkeypatch):
    from oresearcher.errors import cli_main
    from oresearcher.run import main

    env = {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli_main(main, ["--scenario", str(write_scenario(tmp_path / "s.yaml"))]) == 2
    assert "pass --num_agents=3" in capsys.readouterr().err


@pytest.mark.parametrize("codes, rc, printed", [
    ([2, 0], 2, False),  # rank 0 refused the profile it measured (it printed why): exit 2, nothing added
    ([2, -15], 2, False),  # ... and the launcher stopped the other rank
    ([1, 0], 1, True),  # a crash is a failure, said as one
    ([2, 1], 1, True),
])
def test_calibrate_exit_code_follows_the_ranks(codes, rc, printed, monkeypatch, capsys):
    from argparse import Namespace

    from oresearcher import calibrate
    from oresearcher.backends.run import launcher

    monkeypatch.setattr(launcher, "launch_local",
                        lambda cmd, world, **kw: launcher.LaunchResult(codes, "rank 0 lost (exit code 2)"))
    assert calibrate._launch(Namespace(backend="gloo", timeout=5.0), ["--scenario", "s.yaml"], 2) == rc
    assert ("calibration failed" in capsys.readouterr().err) == printed
