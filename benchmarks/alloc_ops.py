"""Measuring helpers of benchmarks/bench_allocation.py: the CPU time of one agent step,
alone and with the cores shared. The op-by-op split of a run is
oresearcher.reporting.round_ops."""
from __future__ import annotations

import statistics
from pathlib import Path


def cpu_per_step(steps: int = 1500) -> float:
    """Median CPU seconds of one agent step (forward+backward, optimizer) of the
    scenario's learner in this process (the first 100 steps are warm-up)."""
    import time

    import torch

    from oresearcher.scenario import load_scenario
    from oresearcher.tasks import make_learner

    torch.set_num_threads(1)
    repo = Path(__file__).resolve().parents[1]
    learner = make_learner(load_scenario(repo / "scenarios" / "alloc-8on4.yaml"), 0, mode="real", device="cpu")
    ts = []
    for _ in range(steps + 100):
        t = time.thread_time()
        learner.forward_backward()
        learner.optimizer_step()
        ts.append(time.thread_time() - t)
    return statistics.median(ts[100:])


def contention(procs: int) -> tuple[float, list[float]]:
    """Median CPU seconds per agent step: one process alone, then ``procs`` processes at
    once (as the ranks of a run, on this host's cores): what sharing the cores does to
    the CPU time of the same work (caches and TLBs refilled after every switch)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, str(Path(__file__).resolve()), "--cpu-per-step"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    alone = float(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    ps = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    shared = [float(p.communicate()[0]) for p in ps]
    return alone, shared


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--cpu-per-step"]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(cpu_per_step())
