"""Checkpoint interval against failures: a sweep beside Young/Daly's sqrt(2 C MTBF).

    python benchmarks/bench_faults.py                       # 8xA100, DDP, MTBF 1 h, restart 60 s
    python benchmarks/bench_faults.py --mtbf-s 14400 --seeds 100

The simulator prices one fault-free step T and one checkpoint C (bytes each rank saves /
the device profile's storage bandwidth) for the scenario; then a long run of ``--steps``
steps is replayed with job failures drawn at exponential intervals of mean MTBF
(``sim.faults.failure_times``, one seed per repeat) by the rule the engine applies
(``sim.faults.replay``: every failure costs the work since the last complete checkpoint,
the restart delay and reading the checkpoint back). For each interval k (steps between
checkpoints) it prints the mean total time and goodput (fault-free time / total) over the
seeds, and marks the best k beside Young's first-order optimum sqrt(2 C MTBF)
(Young 1974; Daly 2006), with Young's first-order goodput for comparison. The grid is
k_YD x 2^(i/2), so the sweep resolves the optimum to a factor sqrt 2.
"""
from __future__ import annotations

import argparse
import math
import sys

from rich.console import Console
from rich.table import Table

from oresearcher.scenario import load_scenario
from oresearcher.sim.faults import failure_times, replay, young_daly
from oresearcher.sim.simulate import simulate


def step_and_checkpoint(scenario_path: str, overrides: list[str]) -> tuple[float, float]:
    """(fault-free step time, checkpoint seconds) from the simulator."""
    sc = load_scenario(scenario_path, [*overrides, "training.steps=4", "training.checkpoint_every=2",
                                       "faults.price_checkpoints=true"])
    report, _ = simulate(sc, keep_spans=0)
    f = report["faults"]
    return f["time_fault_free_s"] / report["steps"], f["checkpoints"]["seconds_each"]


def first_order(tau_s: float, ckpt_s: float, mtbf_s: float, lost_s: float) -> float:
    """Young's expected goodput: each period of tau s of work costs C more, and a failure
    (one per MTBF) costs half a period on average plus the restart and restore."""
    return 1.0 / (1.0 + ckpt_s / tau_s + (tau_s / 2 + lost_s) / mtbf_s)


def sweep(step_s: float, ckpt_s: float, mtbf_s: float, delay_s: float, steps: int, seeds: int, intervals):
    """Mean (total time, goodput) over seeds for each checkpoint interval (steps)."""
    base = step_s * steps
    draws = [failure_times(mtbf_s, seed, horizon_s=20 * base) for seed in range(seeds)]
    rows = []
    for k in intervals:
        totals = [replay([step_s] * steps, k, ckpt_s, d, delay_s, ckpt_s)[0] for d in draws]
        mean = sum(totals) / len(totals)
        rows.append((k, mean, base / mean))
    return base, rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="scenarios/8xA100.yaml")
    p.add_argument("--set", action="append", default=["training.strategy=ddp"], help="scenario overrides")
    p.add_argument("--mtbf-s", type=float, default=3600.0, help="mean time between job failures, seconds")
    p.add_argument("--delay-s", type=float, default=60.0, help="restart delay before the restore, seconds")
    p.add_argument("--steps", type=int, default=20_000, help="steps of the replayed run")
    p.add_argument("--seeds", type=int, default=40, help="failure draws averaged per interval")
    args = p.parse_args(argv)
    step_s, ckpt_s = step_and_checkpoint(args.scenario, args.set)
    yd = young_daly(ckpt_s, args.mtbf_s)
    k_yd = yd / step_s
    intervals = sorted({max(1, round(k_yd * 2 ** (e / 2))) for e in range(-6, 7)})
    base, rows = sweep(step_s, ckpt_s, args.mtbf_s, args.delay_s, args.steps, args.seeds, intervals)
    best = max(rows, key=lambda r: r[2])
    out = Console()
    out.print(f"{args.scenario} ({', '.join(args.set)}): step {step_s:.3f} s, checkpoint C = {ckpt_s:.2f} s, "
              f"MTBF {args.mtbf_s:,.0f} s, restart {args.delay_s:g} s + restore C; {args.steps:,} steps "
              f"({base / 3600:.2f} h fault-free), {args.seeds} failure draws per interval")
    t = Table(header_style="bold")
    for col in ("every (steps)", "every (s)", "total (h)", "goodput", "first-order", ""):
        t.add_column(col, justify="right" if col else "left")
    for k, total, good in rows:
        mark = "best" if k == best[0] else ""
        if abs(math.log(k / k_yd)) == min(abs(math.log(r[0] / k_yd)) for r in rows):
            mark = (mark + " " if mark else "") + "~Young/Daly"
        fo = first_order(k * step_s, ckpt_s, args.mtbf_s, args.delay_s + ckpt_s)
        t.add_row(f"{k:,}", f"{k * step_s:,.0f}", f"{total / 3600:.3f}", f"{good:.2%}", f"{fo:.2%}", mark)
    out.print(t)
    out.print(f"sweep optimum: every {best[0]:,} steps = {best[0] * step_s:,.0f} s (goodput {best[2]:.2%}); "
              f"Young/Daly sqrt(2 C MTBF) = {yd:,.0f} s = {k_yd:,.0f} steps; ratio {best[0] * step_s / yd:.2f} "
              f"(grid x sqrt 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
