"""How fast the simulator runs: ranks x steps of data-parallel training in shape mode.

    OMP_NUM_THREADS=1 python benchmarks/bench_sim_speed.py [--quick]

Targets from issue 2: 8 ranks x 10,000 steps under 10 s, 1,024 GPUs (128 nodes x 8) x
100 steps under 60 s, on one core. Prints wall time (median of repeats), ops
interpreted per second and the ratio to the target. The workload is a gpt-125m replica
per GPU with torch DDP's default 25 MB buckets (10 buckets per step, each all-reduced
asynchronously during backward), so a step is ~25 ops per rank.
"""
from __future__ import annotations

import argparse
import statistics
import time

from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import simulate

CASES = [
    # name, scenario file, overrides, target seconds
    ("8 ranks x 10,000 steps", "scenarios/8xA100.yaml",
     ["workload.model=gpt-125m", "training.strategy=ddp", "training.steps=10000"], 10.0),
    ("1,024 GPUs x 100 steps", "scenarios/128x8xA100.yaml", ["training.steps=100"], 60.0),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a tenth of the steps, one repeat")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{'case':<26}{'wall s (median)':>16}{'target s':>10}{'ratio':>8}{'ops':>12}{'ops/s':>12}")
    for name, path, sets, target in CASES:
        if args.quick:
            steps = int(next(s for s in sets if s.startswith("training.steps=")).split("=")[1]) // 10
            sets = [s if not s.startswith("training.steps=") else f"training.steps={steps}" for s in sets]
            target /= 10
        scenario = load_scenario(path, sets)
        simulate(load_scenario(path, sets + ["training.steps=1"]), keep_spans=0)  # warm caches
        walls, ops = [], 0
        for _ in range(1 if args.quick else args.repeats):
            t0 = time.perf_counter()
            report, _ = simulate(scenario, keep_spans=0)
            walls.append(time.perf_counter() - t0)
            ops = report["ops_interpreted"]
        wall = statistics.median(walls)
        print(f"{name:<26}{wall:>16.2f}{target:>10.1f}{wall / target:>8.2f}{ops:>12,}{ops / wall:>12,.0f}")


if __name__ == "__main__":
    main()
