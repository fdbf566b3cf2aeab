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
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cooperation as B  # noqa: E402

# name: (what it tests, overrides that turn it off or swap it)
VARIANTS = {
    "full": ("the method with its defaults", []),
    "no gradient sharing": ("gradient sharing off", ["communication.gradient_sharing=false"]),
    "plain averaging": ("attention fusion -> plain average", ["cooperation.fusion.method=average"]),
    "no roles": ("roles off: every agent trains plainly", ["cooperation.roles.policy=plain"]),
    "no role switching": ("roles kept as first assigned", ["cooperation.roles.policy=static"]),
    "no PBT": ("no sampled hyperparameters, no exploit/explore",
               ["cooperation.roles.lr_range=[1,1]", "cooperation.roles.knob_range=[1,1]",
                "cooperation.roles.exploit_fraction=0", "cooperation.roles.perturb_factor=1"]),
    "no allocation": ("equal local steps for every agent", ["cooperation.allocation.enabled=false"]),
    "+ replay pool": ("a shared hard-example pool (off by default)", ["cooperation.replay.enabled=true"]),
    "+ agreement term": ("co-distillation toward the peers' mean (off by default)",
                         ["cooperation.rewards.peer_term=agreement"]),
    "+ diversity term": ("novelty: pushes agents apart (off by default)", ["cooperation.rewards.peer_term=diversity"]),
    "+ outer Nesterov": ("outer Nesterov on the fusion pseudo-gradient (off by default)",
                         ["cooperation.fusion.outer=nesterov"]),
    "+ distillation": ("a student of the agents' architecture from the fused model, distilled on "
                       "(off: the fused model is deployed)", ["distill.student=mlp"]),
    "+ fresh student": ("a student from a fresh init, distilled (plain distillation)",
                        ["distill.student=mlp", "distill.init=fresh"]),
}
DISTILLING = {"digits"}  # the tasks that can distil (an mlp student: the distillation rows)
REPLAY = {"digits", "cartpole"}  # the tasks with a replay pool
# the tasks whose loss takes a peer term (their learner has set_peer_term); elsewhere
# cooperation.rewards.peer_term changes nothing, so its rows would only repeat the full method
PEER_TERM = {"digits"}
ONLY = {"+ distillation": DISTILLING, "+ fresh student": DISTILLING, "+ replay pool": REPLAY,
        "+ agreement term": PEER_TERM, "+ diversity term": PEER_TERM}


def variants_for(task: str) -> list[str]:
    return [v for v in VARIANTS if task in ONLY.get(v, (task,))]


def run_variant(task: str, variant: str, seed: int, lr: float, size: str, steps: int | None = None) -> dict:
    """One cooperative run with ``variant``'s overrides (bench_cooperation.run_one's fields)."""
    extra = VARIANTS[variant][1]
    saved = B.TASKS[task]
    file, target, sets, sizes = saved
    B.TASKS[task] = (file, target, [*sets, *extra], sizes)
    try:
        return B.run_one(task, "oresearcher", seed, lr, size, steps)
    finally:
        B.TASKS[task] = saved


def equal_steps(task: str, variant: str, seed: int, size: str, target: float) -> int | None:
    """Training steps that bring ``variant`` to ``target`` FLOPs (None: the full's own):
    a calibration run at the full's steps, the steps scaled by the FLOP ratio, and where
    that misses by more than 3% (the FLOPs are not linear in the steps: fusion rounds,
    validation and distillation are per round or per run) one secant step from both runs."""
    n = B.size_of(task, size)[0]
    probe = run_variant(task, variant, seed, 1.0, size)
    if "flops" not in probe or abs(probe["flops"] / target - 1) < 0.01:
        return None
    k = max(1, round(n * target / probe["flops"]))
    second = run_variant(task, variant, seed, 1.0, size, k)
    f1, f2 = probe["flops"], second.get("flops")
    if f2 is None or abs(f2 / target - 1) <= 0.03 or f2 == f1:
        return k
    return max(1, round(n + (k - n) * (target - f1) / (f2 - f1)))


def paired_diff(rows: list[dict], full: list[dict], key: str = "model"):
    """(mean, low, high) of variant - full over the seeds both ran; None below 2 pairs."""
    return B.paired(rows, full, key)


def run_task(task: str, seeds: list[int], size: str, lrs=B.LR_MULTS, log=print, pool=None, only=None) -> dict:
    """{lr: {variant: [run per seed]}} for ``only`` (default every variant of the task) and the full method."""
    starmap = pool.starmap if pool is not None else lambda f, args: [f(*a) for a in args]
    names = [v for v in variants_for(task) if only is None or v == "full" or v in only]
    full1 = starmap(run_variant, [(task, "full", s, 1.0, size) for s in seeds])
    target = statistics.mean(r["flops"] for r in full1 if "flops" in r)
    steps = {v: (None if v == "full" else equal_steps(task, v, seeds[0], size, target)) for v in names}
    out = {lr: {} for lr in lrs}
    out.setdefault(1.0, {})["full"] = full1
    for lr in lrs:
        for v in names:
            if v not in out[lr]:
                out[lr][v] = starmap(run_variant, [(task, v, s, lr, size, steps[v]) for s in seeds])
            ok = [r for r in out[lr][v] if "error" not in r]
            log(f"  {task} lr x{lr:g} {v}: model {B._mean([r['model'] for r in ok]):.4f}, {len(ok)}/{len(seeds)} ran")
    return {"target_flops": target, "steps": steps, "runs": out}


def verdict_word(d) -> str:
    """Which side of the paired difference (variant - full) the interval puts ahead."""
    if d is None:
        return "n/a"
    return "full better" if d[2] < 0 else "variant better" if d[1] > 0 else "tie"


def table(task: str, res: dict, seeds: list[int], out=print) -> None:
    """One Markdown table per task: rows = variants, columns = lr multipliers."""
    lrs = list(res["runs"])
    out(f"\n{task}, seeds {seeds[0]}-{seeds[-1]}, equal FLOPs ({res['target_flops'] / 1e9:.3f} GFLOP per run): "
        "deployed model's test metric, mean; variant - full [95% CI]; verdict on the mechanism\n")
    out("| variant | what | " + " | ".join(f"lr x{lr:g}" for lr in lrs) + " | compute |")
    out("|---|---|" + "---|" * len(lrs) + "---|")
    full = {lr: res["runs"][lr]["full"] for lr in lrs}
    for v in res["runs"][lrs[0]]:
        cells = []
        for lr in lrs:
            rows = [r for r in res["runs"][lr][v] if "error" not in r]
            if not rows:
                cells.append(f"failed ({res['runs'][lr][v][0]['error'][:30]})")
                continue
            m = statistics.mean(r["model"] for r in rows)
            if v == "full":
                cells.append(f"{m:.3f}")
                continue
            d = paired_diff(res["runs"][lr][v], full[lr])
            cells.append(f"{m:.3f}; {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}] {verdict_word(d)}" if d else f"{m:.3f}")
        ok = [r for r in res["runs"][1.0][v] if "flops" in r]
        ratio = statistics.mean(r["flops"] for r in ok) / res["target_flops"] if ok else float("nan")
        steps = res["steps"].get(v)
        out(f"| {v} | {VARIANTS[v][0]} | " + " | ".join(cells) + f" | x{ratio:.2f}" +
            (f" ({steps} steps)" if steps else "") + " |")


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


def pays(variant: str, d) -> str:
    """What a row's interval says about its mechanism: the mechanism a row switches off
    ("no ...", "plain ...") pays where the full method is better; the one a row adds
    ("+ ...", off by default) pays where the variant is better."""
    word = verdict_word(d)
    if word in ("tie", "n/a"):
        return word
    adds = variant.startswith("+")
    return "pays" if (word == "variant better") == adds else "costs"


def summary(saved: dict, out=print) -> None:
    """One table over tasks: per mechanism and task, at lr x0.1 / x1 / x10, whether it pays
    (the paired 95% interval excludes 0 in its favour), costs, or ties."""
    tasks = list(saved)
    out("| mechanism | " + " | ".join(f"{t} (x0.1 / x1 / x10)" for t in tasks) + " |")
    out("|---|" + "---|" * len(tasks))
    names = [v for v in VARIANTS if v != "full"]
    for v in names:
        cells = []
        for t in tasks:
            runs = {float(k): r for k, r in saved[t]["runs"].items()}
            if v not in runs[1.0]:
                cells.append("-")
                continue
            cells.append(" / ".join(pays(v, paired_diff(runs[lr][v], runs[lr]["full"])) if v in runs.get(lr, {})
                                    else "-" for lr in sorted(runs)))
        out(f"| {v} | " + " | ".join(cells) + " |")
    out("\npays: the mechanism the row switches off ('no ...', 'plain ...': the default has it) or adds ('+ ...': "
        "off by default) improves the deployed model, the paired 95% interval over the seeds excluding 0; "
        "costs: it makes it worse; tie: the interval holds 0; -: not applicable to the task")


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
    bad = [t for t in tasks if t not in B.TASKS] + [v for v in only or () if v not in VARIANTS]
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
        B.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
