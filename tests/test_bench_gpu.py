"""benchmarks/bench_gpu.py end to end on the CPU (--dry-run): every row of the GPU check
is produced, so the GPU machine's run is one command that has already run here."""
import importlib.util
import math
import re
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_prints_every_row_of_the_gpu_check(capsys):
    torch.set_num_threads(1)
    assert _bench().main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
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


def test_without_cuda_and_without_dry_run_is_one_line(capsys):
    if torch.cuda.is_available():
        import pytest
        pytest.skip("this machine has CUDA")
    assert _bench().main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]
