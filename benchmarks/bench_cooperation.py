"""Does cooperation beat one agent at equal compute? A fair, small benchmark.

    python benchmarks/bench_cooperation.py                 # full: 4 tasks, 5 seeds, lr x0.1/x1/x10
    python benchmarks/bench_cooperation.py --quick         # CI-sized smoke (2 seeds, a few steps)
    python benchmarks/bench_cooperation.py --designed      # each scenario at its own steps and interval
    python benchmarks/bench_cooperation.py --tasks digits --seeds 5 --json out.json

Methods, all in the simulator's numeric mode (the same math as the real backends):
``single`` (one agent, the whole global batch), ``ddp`` (synchronous data parallel),
``diloco`` (periodic averaging + outer Nesterov), ``pbt`` (population-based training
alone: exploit/explore every round, no roles, no fusion; benchmarks/coop_harness.py) and
``oresearcher`` (the task's cooperative scenario, deploying the fused model: no
distillation phase, which for a student of the agents' own architecture did not pay at
equal compute; bench_ablation.py's "+ distillation" row).

Equal compute: every Compute FLOP a program issues is counted (coop_harness): for the
cooperative program that includes the peers' forward passes of the shaped loss, the
validators' evaluations, the ensemble fits and the distillation. The cooperative runs
at lr x1 go first; each baseline's steps are then set so that its counted FLOPs match
their mean (from a two-round calibration run), and the table prints every method's
counted compute beside the cooperative program's.

The same two statistics for every method, on held-out test data:
- "agents": the mean over the agents of each final agent's test metric;
- "model": the test metric of the one model the method deploys: the student for
  oresearcher where a scenario distils (``distill.student``), else the plain average of
  its final agents (the fused model); the average of the agents for ddp/diloco/pbt; the
  model for single.
Time-to-target is read from the "agents" statistic at every round (simulated seconds on
an 8xA100 clock); "model" is only known at the end, where the table gives it.

Every cell: mean [95% CI, t-distribution] and the median over seeds (held out from the
seeds 0-2 the scenarios were tuned on). The verdict compares oresearcher with the best
baseline of each cell by the paired difference over seeds. Printed as measured.
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

import coop_harness as H  # noqa: E402
from oresearcher.programs.divergence import AllExcluded, Diverged  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
A100 = ["cluster.device=A100-SXM4-80GB", "cluster.intra_node=nvswitch-a100", "cluster.gpus_per_node=8"]
METHODS = {
    "single": ["training.strategy=single", "agents.count=1", "agents.roles=null"],
    "ddp": ["training.strategy=ddp"],
    "diloco": ["training.strategy=diloco"],
    "pbt": ["training.strategy=local_sgd"],  # the program is coop_harness.pbt
    "oresearcher": ["training.strategy=oresearcher"],
}
# the cooperative settings of digits-4.yaml, for the scenarios that do not set them
COOP = ["cooperation.roles={policy: dynamic, optimizer_method: swa}",
        "cooperation.fusion={method: attention, temperature: 0.1, similarity_weight: 0.5}",
        "cooperation.rewards={schedule: cosine}",
        "cooperation.allocation={enabled: true, temperature: 0.1, floor: 0.5}"]
# per task: scenario, target of the "agents" statistic, extra settings,
# sizes {full|quick: (steps, communication.interval = H, distill.steps or 0)}
TASKS = {
    "digits": ("digits-4.yaml", 0.93, [],
               {"full": (30, 10, 15), "quick": (12, 6, 6)}),
    "cartpole": ("cartpole-4.yaml", 30.0, [], {"full": (150, 50, 0), "quick": (30, 15, 0)}),
    "synthetic-lm": ("cpu-tiny.yaml", 0.5, [
        "simulation.mode=numeric", "workload.seq_len=16", "training.lr=0.003",
        "agents.roles={explorer: 1, optimizer: 2, validator: 1}", *COOP], {"full": (12, 4, 0), "quick": (8, 4, 0)}),
    "finance": ("finance.yaml", 0.7, [
        "agents.architectures=[]", "workload.model=credit-transformer", "agents.count=4",
        "workload.global_batch=128", "agents.roles={explorer: 1, optimizer: 2, validator: 1}"],
        {"full": (16, 8, 0), "quick": (12, 6, 0)}),
}
LR_MULTS = (0.1, 1.0, 10.0)


def size_of(task: str, size: str) -> tuple[int, int, int]:
    """(steps, communication.interval, distill.steps or 0) of ``size``: quick, full, or
    designed (the scenario file's own steps and interval, distillation at its default)."""
    from oresearcher.scenario import load_scenario

    file, _, extra, sizes = TASKS[task]
    if size != "designed":
        return sizes[size]
    sc = load_scenario(ROOT / "scenarios" / file, extra)
    return sc.training.steps, sc.communication.interval, 0


def scenario(task: str, method: str, seed: int, lr_mult: float, size: str, steps: int | None = None):
    from oresearcher.scenario import load_scenario

    file, _, extra, sizes = TASKS[task]
    n, interval, distill = size_of(task, size)
    agents = load_scenario(ROOT / "scenarios" / file, extra).agents.count  # kept on the A100 clock's 8 GPUs
    sets = [*A100, f"agents.count={agents}", *extra, f"seed={seed}", f"communication.interval={interval}",
            f"training.local_steps={interval}", f"training.eval_every={interval}"]
    if distill:  # where a variant distils (distill.student)
        sets.append(f"distill.steps={distill}")
    base = load_scenario(ROOT / "scenarios" / file, sets)
    # the student's lr is its own: the sweep mis-sets the agents' lr, not the deployment's
    sets += [f"training.steps={steps or n}", f"training.lr={base.training.lr * lr_mult:g}", *METHODS[method]]
    if method != "oresearcher":
        sets.append("distill.student=null")
    return load_scenario(ROOT / "scenarios" / file, sets)


def agents_curve(report: dict) -> list[tuple[float, float]]:
    """[(simulated time, mean over agents of the test metric)] at each evaluation."""
    per_rank = [report["metrics"][r] for r in sorted(report["metrics"], key=int)]
    evals = [[m for m in recs if "metric" in m] for recs in per_rank]
    return [(max(e[k]["time_s"] for e in evals), statistics.mean(e[k]["metric"] for e in evals))
            for k in range(min(len(e) for e in evals))]


def run_one(task: str, method: str, seed: int, lr_mult: float, size: str, steps: int | None = None) -> dict:
    sc = scenario(task, method, seed, lr_mult, size, steps)
    t0 = time.perf_counter()
    try:
        report, learners, flops, by_name = H.simulate_counted(sc, H.pbt if method == "pbt" else None)
    except (Diverged, AllExcluded) as e:  # a diverged run is a result too (e.g. lr x10)
        return {"error": f"{type(e).__name__}: {str(e)[:120]}", "steps": sc.training.steps}
    agents = statistics.mean(H.metric_of(l) for l in learners)
    student = getattr(learners[0], "distill_result", None)
    model = (student["metrics"]["student_test_accuracy"] if student else H.averaged_metric(learners))
    curve = agents_curve(report)
    hit = next((t for t, m in curve if m >= TASKS[task][1]), None)
    return {"agents": agents, "model": float(model), "flops": flops, "by_name": by_name, "ttt": hit, "curve": curve,
            "steps": sc.training.steps, "end_s": curve[-1][0] if curve else None,
            "wall_s": time.perf_counter() - t0}


def flops_at(steps: int, interval: int, per_step: float, per_round: float) -> float:
    """A baseline's FLOPs: ``per_step`` each step plus ``per_round`` at every round end
    but the last (PBT's validation; zero for single/ddp; DiLoCo's outer step)."""
    return steps * per_step + (-(-steps // interval) - 1) * per_round


def equal_compute_steps(task: str, method: str, seed: int, size: str, target: float) -> int:
    """Steps that give ``method`` ``target`` FLOPs, from runs of one and two rounds."""
    interval = size_of(task, size)[1]
    one, two = (run_one(task, method, seed, 1.0, size, steps=k * interval)["flops"] for k in (1, 2))
    per_step, per_round = one / interval, two - 2 * one
    return min(range(1, 100 * size_of(task, size)[0]),
               key=lambda k: (abs(flops_at(k, interval, per_step, per_round) - target), k))


def run_task(task: str, seeds: list[int], size: str, methods: list[str], log=print, lrs=LR_MULTS,
             pool=None) -> dict:
    """{lr_mult: {method: [run per seed]}}, baselines at the cooperative program's compute.
    ``pool``: a multiprocessing pool that runs the seeds of one cell side by side."""
    out = {m: {} for m in lrs}
    starmap = pool.starmap if pool is not None else lambda f, args: [f(*a) for a in args]
    coop = starmap(run_one, [(task, "oresearcher", s, 1.0, size) for s in seeds])
    out[1.0]["oresearcher"] = coop
    target = statistics.mean(r["flops"] for r in coop if "flops" in r)
    steps = {"oresearcher": None}
    for m in methods:
        if m == "oresearcher":
            continue
        steps[m] = equal_compute_steps(task, m, seeds[0], size, target)
        log(f"  {task}: {m} gets {steps[m]} steps for {target / 1e9:.3f} GFLOP")
    for lr in lrs:
        for m in methods:
            if m not in out[lr]:
                out[lr][m] = starmap(run_one, [(task, m, s, lr, size, steps[m]) for s in seeds])
            ok = [r for r in out[lr][m] if "error" not in r]
            log(f"  {task} lr x{lr:g} {m}: model {_mean([r['model'] for r in ok]):.4f}, "
                f"agents {_mean([r['agents'] for r in ok]):.4f}, {len(ok)}/{len(seeds)} ran")
    return {"target_flops": target, "steps": steps, "runs": out}


def _mean(xs):
    return statistics.mean(xs) if xs else float("nan")


def ci95(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the t-distribution's 95% interval of the mean."""
    from scipy import stats

    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    h = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, m - h, m + h


def cell(xs: list[float], fmt: str) -> str:
    if not xs:
        return "-"
    m, lo, hi = ci95(xs)
    return f"{fmt.format(m)} [{fmt.format(lo)}, {fmt.format(hi)}] med {fmt.format(statistics.median(xs))}"


def paired(a: list[dict], b: list[dict], key: str) -> tuple[float, float, float] | None:
    """95% CI of the mean of a - b over the seeds both ran."""
    d = [x[key] - y[key] for x, y in zip(a, b) if "error" not in x and "error" not in y]
    return ci95(d) if len(d) >= 2 else None


def verdict(rows: dict, key: str) -> tuple[str, str]:
    """(best baseline, 'wins'/'loses'/'ties' with the paired CI) for oresearcher."""
    base = {m: _mean([r[key] for r in runs if "error" not in r]) for m, runs in rows.items() if m != "oresearcher"}
    if "oresearcher" not in rows or not base:
        return "-", "-"
    best = max(base, key=lambda m: (base[m], m))
    p = paired(rows["oresearcher"], rows[best], key)
    if p is None:
        return best, "n/a"
    m, lo, hi = p
    word = "wins" if lo > 0 else "loses" if hi < 0 else "ties"
    return best, f"{word} ({m:+.4f} [{lo:+.4f}, {hi:+.4f}])"


def compute_shares(runs: list[dict]) -> str:
    """Where the cooperative program's FLOPs go, summed over its runs (largest first)."""
    total: dict = {}
    for r in runs:
        for k, v in r.get("by_name", {}).items():
            total[k] = total.get(k, 0.0) + v
    s = sum(total.values())
    return ", ".join(f"{k} {v / s:.0%}" for k, v in sorted(total.items(), key=lambda kv: -kv[1]) if v / s >= 0.005) \
        if s else ""


def table(task: str, res: dict, seeds: list[int]) -> None:
    from rich.console import Console
    from rich.table import Table

    fmt = "{:.1f}" if task == "cartpole" else "{:.3f}"
    for lr, rows in res["runs"].items():
        t = Table(title=f"{task}, lr x{lr:g}, seeds {seeds[0]}-{seeds[-1]}: mean [95% CI] median")
        for col in ("method", "model (deployed)", "agents (mean)", f"time to {TASKS[task][1]:g} (ms)", "compute",
                    "steps"):
            t.add_column(col, justify="left" if col == "method" else "right")
        for m, runs in rows.items():
            ok = [r for r in runs if "error" not in r]
            if not ok:
                t.add_row(m, runs[0]["error"][:50], "", "", "", str(runs[0]["steps"]))
                continue
            hits = [r["ttt"] * 1e3 for r in ok if r["ttt"] is not None]
            ttt = f"{statistics.median(hits):.2f} ({len(hits)}/{len(ok)})" if hits else f"- (0/{len(ok)})"
            flops = _mean([r["flops"] for r in ok]) / res["target_flops"]
            t.add_row(m + ("" if len(ok) == len(runs) else f" ({len(ok)}/{len(runs)} ran)"),
                      cell([r["model"] for r in ok], fmt), cell([r["agents"] for r in ok], fmt), ttt,
                      f"x{flops:.3f}", str(ok[0]["steps"]))
        Console(width=160).print(t)
        shares = compute_shares(rows.get("oresearcher", []))
        if shares:
            print(f"  oresearcher's compute by op: {shares}")
        for key in ("model", "agents"):
            best, word = verdict(rows, key)
            print(f"  verdict ({key}): oresearcher vs best baseline {best}: {word}")


def plot(task: str, res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key in zip(axes[:2], ("model", "agents")):
        for m in res["runs"][1.0]:
            xs, ys, lo, hi = [], [], [], []
            for lr, rows in res["runs"].items():
                ok = [r[key] for r in rows.get(m, []) if "error" not in r]
                if len(ok) >= 2:
                    mu, a, b = ci95(ok)
                    xs.append(lr), ys.append(mu), lo.append(mu - a), hi.append(b - mu)
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=m, lw=2.5 if m == "oresearcher" else 1.2)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate x base")
        ax.set_title(f"{task}: {'deployed model' if key == 'model' else 'mean over agents'} (test, 95% CI)")
        ax.grid(alpha=0.3)
    for m, runs in res["runs"][1.0].items():
        curves = [r["curve"] for r in runs if "error" not in r and r["curve"]]
        if curves:
            k = min(len(c) for c in curves)
            axes[2].plot([statistics.mean(c[i][0] for c in curves) * 1e3 for i in range(k)],
                         [statistics.mean(c[i][1] for c in curves) for i in range(k)], marker=".", label=m)
    axes[2].axhline(TASKS[task][1], color="grey", ls=":", label="target")
    axes[2].set_xlabel("simulated time, 8xA100 clock (ms)")
    axes[2].set_title("lr x1: mean over agents vs time (seed mean)")
    axes[2].grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", type=int, help="number of seeds (default 5; --quick 2)")
    p.add_argument("--first-seed", type=int, default=100,
                   help="seeds first-seed.. (the scenarios' settings were picked on seeds 0-2: keep them out)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--quick", action="store_true", help="CI-sized smoke: a few steps, 2 seeds")
    p.add_argument("--designed", action="store_true", help="each task at its scenario file's own steps and "
                   "interval (distillation at its default steps) instead of the full size")
    p.add_argument("--plots", default=str(ROOT / "docs" / "img"), help="directory of coop-<task>.png ('' : none)")
    p.add_argument("--json", help="write all raw results here")
    p.add_argument("--jobs", type=int, default=1, help="processes running the seeds of a cell side by side")
    args = p.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.ERROR)
    size = "quick" if args.quick else "designed" if args.designed else "full"
    seeds = list(range(args.first_seed, args.first_seed + (args.seeds or (2 if args.quick else 5))))
    tasks, methods = args.tasks.split(","), args.methods.split(",")
    bad = [t for t in tasks if t not in TASKS] + [m for m in methods if m not in METHODS]
    if bad or "oresearcher" not in methods:
        print(f"bench_cooperation: unknown task/method {bad} (or oresearcher missing)", file=sys.stderr)
        return 2
    results, t0 = {}, time.perf_counter()
    pool = None
    if args.jobs > 1:
        import multiprocessing

        pool = multiprocessing.get_context("spawn").Pool(args.jobs)
    for task in tasks:
        res = run_task(task, seeds, size, methods, log=lambda s: print(s, file=sys.stderr, flush=True), pool=pool)
        results[task] = res
        table(task, res, seeds)
        if args.plots:
            plot(task, res, Path(args.plots) / f"coop-{task}.png")
    if pool is not None:
        pool.close()
        pool.join()
    print(f"total wall {time.perf_counter() - t0:.0f} s ({size})")
    if args.json:
        write_json(args.json, results)
    return 0


def write_json(path, results: dict) -> None:
    """Every task's results with their raw runs (run keys as strings, for JSON)."""
    Path(path).write_text(json.dumps(
        {t: {**r, "runs": {str(k): v for k, v in r["runs"].items()}} for t, r in results.items()}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
