"""benchmarks/bench_gpu.py end to end on the CPU (--dry-run), run as a user runs it: every
row of the GPU check is produced, so the GPU machine's run is one command that has
already run here."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch


def _bench(*argv):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "benchmarks/bench_gpu.py", *argv], capture_output=True, text=True, env=env)


def test_dry_run_prints_every_row_of_the_gpu_check():
    p = _bench("--dry-run")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith("bench_gpu on CPU dry run (profile cpu-local)")
    assert lines[1].split() == ["check", "measured", "model", "or", "target", "verdict"]
    rows = {re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line)[1:] for line in lines[3:]}
    assert re.match(r"\d+ (passed|skipped)", rows["tests (NCCL, CUDA codecs, stream)"][0])  # pytest's summary
    assert "GEMM" in rows["calibrate_device(cpu)"][0] and rows["calibrate_device(cpu)"][-1] == "ok"
    for kind in ("flat", "roofline", "calibrated"):
        step = rows[f"gpt-tiny step ({kind})"]
        measured, predicted = (float(re.match(r"([\d.]+) ms", c).group(1)) for c in step[:2])
        assert measured > 0 and predicted > 0 and step[2] in ("ok", "MISS")
    assert 0 <= float(rows["gpt-tiny data share"][0].rstrip("%")) < 100
    for n in ("4K", "64K"):
        for spec in ("int8", "int8:stochastic", "ef(int8)", "bf16", "fp16", "randk:0.01", "topk:0.01"):
            x = float(re.search(r"cpu path ([\d.]+)x", rows[f"codec {spec} @{n}"][0]).group(1))
            assert math.isfinite(x) and x > 0
        assert rows[f"topk 1% @{n}"][0].startswith("exact ")


def test_without_cuda_and_without_dry_run_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    p = _bench()
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]
