"""Does cooperation beat one agent at equal compute? The comparison's runs and verdicts
(``benchmarks/bench_cooperation.py`` is its command line and tables).

Methods, all in the simulator's numeric mode (the same math as the real backends):
``single`` (one agent, the whole global batch), ``ddp`` (synchronous data parallel),
``diloco`` (periodic averaging + outer Nesterov), ``pbt`` (population-based training
alone: :mod:`oresearcher.programs.pbt`) and ``oresearcher`` (the task's cooperative
scenario, deploying the fused model unless a variant distils).

Equal compute: every Compute FLOP a program issues is counted (:mod:`.counted`). The
cooperative runs at lr x1 go first; each baseline's steps are then set so that its
counted FLOPs match their mean (:func:`equal_compute_steps`, from a two-round
calibration run).

Two statistics per run, on held-out test data: "agents", the mean over the agents of
each final agent's test metric; "model", the test metric of the one model the method
deploys (the student where a scenario distils, else the plain average of the final
agents; the model for single). Time-to-target is read from the "agents" statistic at
every round (simulated seconds on an 8xA100 clock).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..programs.divergence import AllExcluded, Diverged
from ..programs.pbt import pbt
from ..reporting.stats import mean_or_nan, paired, verdict_word
from ..scenario.shipped import shipped_scenarios
from .counted import averaged_eval, simulate_counted

A100 = ["cluster.device=A100-SXM4-80GB", "cluster.intra_node=nvswitch-a100", "cluster.gpus_per_node=8"]
METHODS = {
    "single": ["training.strategy=single", "agents.count=1", "agents.roles=null"],
    "ddp": ["training.strategy=ddp"],
    "diloco": ["training.strategy=diloco"],
    "pbt": ["training.strategy=local_sgd"],  # the program is oresearcher.programs.pbt
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
    # fine-tuning from one base (pretrained once, cached); metric: multiple-choice accuracy, and the
    # validation loss beside it (lower is better: loss columns)
    "text": ("text-4.yaml", 0.3, [
        "workload.model=text-25k", "distill.student=text-25k", "workload.global_batch=16", "workload.seq_len=64",
        "workload.options.eval_tokens=1024", "workload.options.mc_questions=40",
        "workload.options.pretrain={corpus: sotu, steps: 200, batch: 8, lr: 0.003, seed: 0}"],
        {"full": (12, 4, 4), "quick": (8, 4, 2)}),
}
LR_MULTS = (0.1, 1.0, 10.0)


def _load(file: str, sets: list[str]):
    from ..scenario import load_scenario

    return load_scenario(shipped_scenarios()[Path(file).stem], sets)


def size_of(task: str, size: str, extra_sets: list[str] = ()) -> tuple[int, int, int]:
    """(steps, communication.interval, distill.steps or 0) of ``size``: quick, full, or
    designed (the scenario file's own steps and interval, distillation at its default)."""
    file, _, extra, sizes = TASKS[task]
    if size != "designed":
        return sizes[size]
    sc = _load(file, [*extra, *extra_sets])
    return sc.training.steps, sc.communication.interval, 0


def scenario(task: str, method: str, seed: int, lr_mult: float, size: str, steps: int | None = None,
             extra_sets: list[str] = ()):
    """``method``'s scenario of ``task`` on the A100 clock; ``extra_sets`` after the
    task's own settings (an ablation variant's)."""
    file, _, extra, sizes = TASKS[task]
    extra = [*extra, *extra_sets]
    n, interval, distill = size_of(task, size, extra_sets)
    agents = _load(file, extra).agents.count  # kept on the A100 clock's 8 GPUs
    sets = [*A100, f"agents.count={agents}", *extra, f"seed={seed}", f"communication.interval={interval}",
            f"training.local_steps={interval}", f"training.eval_every={interval}"]
    if distill:  # where a variant distils (distill.student)
        sets.append(f"distill.steps={distill}")
    base = _load(file, sets)
    # the student's lr is its own: the sweep mis-sets the agents' lr, not the deployment's
    sets += [f"training.steps={steps or n}", f"training.lr={base.training.lr * lr_mult:g}", *METHODS[method]]
    if method != "oresearcher":
        sets.append("distill.student=null")
    return _load(file, sets)


def agents_curve(report: dict) -> list[tuple[float, float]]:
    """[(simulated time, mean over agents of the test metric)] at each evaluation."""
    per_rank = [report["metrics"][r] for r in sorted(report["metrics"], key=int)]
    evals = [[m for m in recs if "metric" in m] for recs in per_rank]
    return [(max(e[k]["time_s"] for e in evals), statistics.mean(e[k]["metric"] for e in evals))
            for k in range(min(len(e) for e in evals))]


def run_one(task: str, method: str, seed: int, lr_mult: float, size: str, steps: int | None = None,
            extra_sets: list[str] = ()) -> dict:
    """One run's statistics (module doc), counted FLOPs (total and by op name), time to
    target and curve; ``{"error", "steps"}`` where it diverged."""
    sc = scenario(task, method, seed, lr_mult, size, steps, extra_sets)
    t0 = time.perf_counter()
    try:
        report, learners, flops, by_name = simulate_counted(sc, pbt if method == "pbt" else None)
    except (Diverged, AllExcluded) as e:  # a diverged run is a result too (e.g. lr x10)
        return {"error": f"{type(e).__name__}: {str(e)[:120]}", "steps": sc.training.steps}
    evals = [l.evaluate() for l in learners]
    agents = statistics.mean(float(e["metric"]) for e in evals)
    student = learners[0].distill_result
    sm = student["metrics"] if student else {}
    deployed = {} if student else averaged_eval(learners)
    model = sm.get("student_test_accuracy", sm.get("student_mc_accuracy")) if student else deployed["metric"]
    curve = agents_curve(report)
    hit = next((t for t, m in curve if m >= TASKS[task][1]), None)
    out = {"agents": agents, "model": float(model), "flops": flops, "by_name": by_name, "ttt": hit, "curve": curve,
           "steps": sc.training.steps, "end_s": curve[-1][0] if curve else None,
           "wall_s": time.perf_counter() - t0}
    if "val_loss" in evals[0]:  # a language model: its validation loss too (nats/token; lower is better)
        out["agents_loss"] = statistics.mean(float(e["val_loss"]) for e in evals)
        out["model_loss"] = float(sm["student_val_loss"] if student else deployed["val_loss"])
    return out


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


def starmap_of(pool):
    """``pool.starmap``, or the same in this process without a pool."""
    return pool.starmap if pool is not None else lambda f, args: [f(*a) for a in args]


def run_task(task: str, seeds: list[int], size: str, methods: list[str], log=print, lrs=LR_MULTS,
             pool=None) -> dict:
    """{lr_mult: {method: [run per seed]}}, baselines at the cooperative program's compute.
    ``pool``: a multiprocessing pool that runs the seeds of one cell side by side."""
    out = {m: {} for m in lrs}
    starmap = starmap_of(pool)
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
            log(f"  {task} lr x{lr:g} {m}: model {mean_or_nan([r['model'] for r in ok]):.4f}, "
                f"agents {mean_or_nan([r['agents'] for r in ok]):.4f}, {len(ok)}/{len(seeds)} ran")
    return {"target_flops": target, "steps": steps, "runs": out}


def verdict(rows: dict, key: str, higher: bool = True) -> tuple[str, str]:
    """(best baseline, 'wins'/'loses'/'ties' with the paired CI) for oresearcher; ``higher``:
    whether a larger ``key`` is better (a loss: False)."""
    base = {m: mean_or_nan([r[key] for r in runs if "error" not in r]) for m, runs in rows.items()
            if m != "oresearcher"}
    if "oresearcher" not in rows or not base:
        return "-", "-"
    best = (max if higher else min)(base, key=lambda m: (base[m], m))
    p = paired(rows["oresearcher"], rows[best], key)
    if p is None:
        return best, "n/a"
    m, lo, hi = p
    word = verdict_word(p, "wins", "loses", "ties") if higher else verdict_word(p, "loses", "wins", "ties")
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


def write_json(path, results: dict) -> None:
    """Every task's results with their raw runs (run keys as strings, for JSON)."""
    from ..files import write_text

    write_text(Path(path), json.dumps(
        {t: {**r, "runs": {str(k): v for k, v in r["runs"].items()}} for t, r in results.items()}, indent=1))
