"""The NCCL path: one GPU, world size 1 (the device machines have one). Skipped cleanly
on machines without CUDA or NCCL."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from bk_helpers import REPO, write_scenario

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and dist.is_nccl_available()),
                                reason="needs a CUDA GPU and NCCL")


def test_nccl_run_on_one_gpu(tmp_path, child_env):
    sc = write_scenario(tmp_path / "s.yaml", agents={"count": 1})
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "oresearcher.run", "--backend=nccl", "--scenario", str(sc),
                        "--learner", "bk_tiny:make_learner", "--out", str(out), "--steps", "20"],
                       cwd=REPO, env=child_env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["backend"] == "nccl" and rep["steps"] == 20 and rep["device"] != "cpu"
    assert rep["step_time_s"] > 0 and rep["compute_time_s"] > 0


def test_nccl_interpreter_results_on_the_gpu():
    from oresearcher import ops as O
    from oresearcher.backends.run.interpreter import Interpreter, make_clock
    from oresearcher.reporting.report import Timeline

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        out = []

        def prog():
            x = torch.arange(6.0, device="cuda")
            out.append((yield O.AllReduce(x, op="avg")))
            h = yield O.AllGather(x, async_op=True)
            out.append((yield O.Wait(h))[0])
            out.append((yield O.Broadcast(x, src=0)))

        tl = Timeline(1)
        Interpreter(0, 1, device=torch.device("cuda", 0), timeline=tl, clock=make_clock(), backend="nccl").run(prog())
        for t in out:
            assert t.is_cuda and torch.equal(t.cpu(), torch.arange(6.0))
        assert {s.cat for s in tl.spans} == {"comm", "blocked"}
    finally:
        dist.destroy_process_group()
