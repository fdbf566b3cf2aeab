"""How fast the simulator runs: ranks x steps of data-parallel training in shape mode,
and a sweep on a process pool against the same sweep one configuration after another.

    OMP_NUM_THREADS=1 python benchmarks/bench_sim_speed.py [--quick] [--repeats 3]

Targets (one core): 8 ranks x 10,000 steps <= 2 s; 1,024 GPUs (128 nodes x 8) x 100 steps
<= 5 s; 16,384 GPUs (2,048 nodes x 8) x 10 steps <= 60 s with peak memory under 4 GB; a
128-configuration sweep with 2 workers >= 1.8x faster than serial (the median speed-up of
``--repeats`` side-by-side pairs, alternating which runs first: one pair swings by 0.5x on a
shared VM). Each simulation case
runs in a fresh Python process (its peak resident memory is its own, imports included)
and prints wall seconds (median of repeats), the process's CPU seconds (on a shared
machine the wall clock also counts other people's work), the ratio of each to the
target, the ops the run stands for (a symmetric class counts every member) and the
processes the engine ran. The workload is a gpt-125m replica per GPU with torch DDP's
default 25 MB buckets (10 buckets per step, each all-reduced during backward), so a
step is ~28 ops per rank. The sweep varies communication.bucket_size_MB over 128 values
of the 8-rank case at 100 steps.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SPEED = ["workload.model=gpt-125m", "training.strategy=ddp"]
BIG = ["cluster.nodes=2048", "agents.count=16384", "workload.global_batch=131072"]
CASES = {
    # name: (scenario file, overrides, steps, target seconds)
    "8 ranks x 10,000 steps": ("scenarios/8xA100.yaml", SPEED, 10_000, 2.0),
    "1,024 GPUs x 100 steps": ("scenarios/128x8xA100.yaml", [], 100, 5.0),
    "16,384 GPUs x 10 steps": ("scenarios/128x8xA100.yaml", BIG, 10, 60.0),
}
SWEEP_TARGET = 1.8


def run_case(name: str, steps: int, repeats: int) -> dict:
    """One case in this process: warm the caches with one step, then time ``repeats`` runs."""
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.simulate import simulate

    path, sets, _, _ = CASES[name]
    simulate(load_scenario(path, [*sets, "training.steps=1"]), keep_spans=0)
    scenario = load_scenario(path, [*sets, f"training.steps={steps}"])
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        report, _ = simulate(scenario, keep_spans=0)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus), "ops": report["ops_interpreted"],
            "processes": report["engine"]["processes"],
            "peak_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def sweep_speedup(configs: int, jobs: int, pool_first: bool = False) -> tuple[float, float, bool]:
    """(serial s, pool s, identical reports) of one sweep over ``configs`` bucket sizes;
    ``pool_first``: time the pool before the serial sweep (pairs alternate the order, so
    a host speeding up or slowing down within a pair favours neither side)."""
    from oresearcher.sim.sweep import run_pool

    path, sets, _, _ = CASES["8 ranks x 10,000 steps"]
    grid = [[*sets, "training.steps=100", f"communication.bucket_size_MB={1 + i}"] for i in range(configs)]
    run_pool(path, grid[:1], None, 1)  # warm the caches the workers inherit
    out, took = {}, {}
    for j in ((jobs, 1) if pool_first else (1, jobs)):
        t0 = time.perf_counter()
        out[j] = run_pool(path, grid, None, j)
        took[j] = time.perf_counter() - t0
    return took[1], took[jobs], json.dumps(out[1], sort_keys=True) == json.dumps(out[jobs], sort_keys=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a tenth of the steps (16,384 GPUs: one), one repeat, "
                                                         "a 16-configuration sweep; targets scaled alike")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--case", help=argparse.SUPPRESS)  # a child process: run one case, print JSON
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1")
    if args.case:
        print(json.dumps(run_case(args.case, args.steps, args.repeats)))
        return
    repeats = 1 if args.quick else args.repeats
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_sim_to_real import cpu_ticks, host_stolen  # the share of CPU time the hypervisor took

    ticks0 = cpu_ticks()
    print(f"{'case':<24}{'wall s':>9}{'cpu s':>8}{'target s':>10}{'wall/tgt':>9}{'cpu/tgt':>9}"
          f"{'ops':>13}{'ops/cpu s':>12}{'procs':>7}{'peak MB':>9}")
    for name, (_, _, steps, target) in CASES.items():
        if args.quick:
            steps, target = max(steps // 10, 1), target * max(steps // 10, 1) / steps
        out = subprocess.run([sys.executable, __file__, "--case", name, "--steps", str(steps),
                              "--repeats", str(repeats)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:<24}{r['wall']:>9.2f}{r['cpu']:>8.2f}{target:>10.2f}{r['wall'] / target:>9.2f}"
              f"{r['cpu'] / target:>9.2f}{r['ops']:>13,}{r['ops'] / r['cpu']:>12,.0f}{r['processes']:>7}"
              f"{r['peak_MB']:>9,.0f}")
    configs = 16 if args.quick else 128
    # serial and pooled side by side, each repeat (alternating which goes first); the
    # median of the repeats' speed-ups
    runs = [sweep_speedup(configs, 2, pool_first=k % 2 == 1) for k in range(repeats)]
    speedups = sorted(s / p for s, p, _ in runs)
    serial, pooled = statistics.median(s for s, _, _ in runs), statistics.median(p for _, p, _ in runs)
    up = statistics.median(speedups)
    print(f"sweep of {configs} configurations: serial {serial:.2f} s, --jobs 2 {pooled:.2f} s (medians), "
          f"speed-up {up:.2f}x (median of {len(runs)}: {', '.join(f'{x:.2f}' for x in speedups)}; "
          f"target >= {SWEEP_TARGET}x: ratio {up / SWEEP_TARGET:.3f}); reports identical: {all(r[2] for r in runs)}")
    if host_stolen(ticks0):
        print(f"host: {host_stolen(ticks0)[2:]} during the benchmark (given to other machines while this "
              "one had work: a host busier than its load average)")


if __name__ == "__main__":
    main()
