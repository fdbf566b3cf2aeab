"""Which of the cooperative method's mechanisms pay? Each one off (or swapped for its
plain counterpart) against the full method, at equal FLOPs, paired over seeds.

    python benchmarks/bench_ablation.py                       # digits, 5 seeds, lr x0.1/x1/x10
    python benchmarks/bench_ablation.py --tasks digits,finance --seeds 5 --json out.json
    python benchmarks/bench_ablation.py --quick               # CI-sized smoke (2 seeds, quick sizes)
    python benchmarks/bench_ablation.py --summary benchmarks/results/ablation-*.json   # which mechanisms pay

The runs are bench_cooperation.py's (the same scenarios, sizes, held-out seeds from 100,
simulator in numeric mode, every Compute FLOP counted); the "full" row is the task's
cooperative scenario with the program's defaults. Each variant changes one mechanism
(:data:`VARIANTS`); where that changes the compute (no peer forwards, a replay pool, ...)
its training steps are scaled so its counted FLOPs match the full method's at lr x1
(from one calibration run on the first seed; the table prints the ratio that resulted).

Every cell: the variant's deployed-model test metric (the student where the task distils,
else the plain average of the agents), mean over seeds, and the paired difference
variant - full with its 95% interval (t-distribution): "full better" when the interval
lies below 0 (the default choice pays against the variant), "variant better" when above,
"tie" when it includes 0. For a row that switches a mechanism off, "full better" means
the mechanism pays; for a row that adds one ("+ ..."), "full better" means adding it
costs. Printed as measured; ``--table JSON`` prints the tables of a saved run again.

The runs, verdicts and tables are oresearcher/experiments/ablation.py's; this script is
their command line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from oresearcher.experiments.ablation import VARIANTS, run_task, summary, table  # noqa: E402
from oresearcher.experiments.methods import TASKS, write_json  # noqa: E402


def print_saved(path: str) -> int:
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        print(f"bench_ablation: cannot read {path}: {e}", file=sys.stderr)
        return 2
    for task, res in saved.items():
        runs = {float(k): v for k, v in res["runs"].items()}
        seeds = list(range(100, 100 + len(runs[1.0]["full"])))
        table(task, {**res, "runs": runs}, seeds)
    return 0


def print_summary(paths: list[str]) -> int:
    saved = {}
    for path in paths:
        try:
            saved.update(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as e:
            print(f"bench_ablation: cannot read {path}: {e}", file=sys.stderr)
            return 2
    summary(saved)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="digits")
    p.add_argument("--seeds", type=int, help="number of seeds (default 5; --quick 2)")
    p.add_argument("--first-seed", type=int, default=100)
    p.add_argument("--lrs", default="0.1,1,10", help="learning-rate multipliers (comma separated)")
    p.add_argument("--quick", action="store_true", help="CI-sized smoke: quick sizes, 2 seeds")
    p.add_argument("--designed", action="store_true", help="each task at its scenario file's own size")
    p.add_argument("--json", help="write all raw results here")
    p.add_argument("--jobs", type=int, default=1, help="processes running the seeds of a cell side by side")
    p.add_argument("--variants", help="comma-separated variants to run beside the full method (default all)")
    p.add_argument("--table", metavar="JSON", help="print the tables of a run saved with --json, run nothing")
    p.add_argument("--summary", metavar="JSON", nargs="+",
                   help="print one table of which mechanisms pay over the runs saved with --json, run nothing")
    args = p.parse_args(argv)
    if args.table:
        return print_saved(args.table)
    if args.summary:
        return print_summary(args.summary)
    tasks = args.tasks.split(",")
    try:
        lrs = tuple(float(x) for x in args.lrs.split(","))
    except ValueError:
        lrs = ()
    only = args.variants.split(",") if args.variants else None
    bad = [t for t in tasks if t not in TASKS] + [v for v in only or () if v not in VARIANTS]
    if bad or not lrs or 1.0 not in lrs:
        print(f"bench_ablation: unknown task or variant {bad}, or --lrs {args.lrs!r} without 1 (the compute is "
              "matched at lr x1)",
              file=sys.stderr)
        return 2
    import logging
    logging.basicConfig(level=logging.ERROR)
    size = "quick" if args.quick else "designed" if args.designed else "full"
    seeds = list(range(args.first_seed, args.first_seed + (args.seeds or (2 if args.quick else 5))))
    pool = None
    if args.jobs > 1:
        import multiprocessing

        pool = multiprocessing.get_context("spawn").Pool(args.jobs)
    results, t0 = {}, time.perf_counter()
    for task in tasks:
        res = run_task(task, seeds, size, lrs, log=lambda s: print(s, file=sys.stderr, flush=True), pool=pool,
                       only=only)
        results[task] = res
        table(task, res, seeds)
    if pool is not None:
        pool.close()
        pool.join()
    print(f"\ntotal wall {time.perf_counter() - t0:.0f} s ({size}); date {time.strftime('%Y-%m-%d', time.gmtime())}")
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
