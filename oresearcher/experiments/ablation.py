"""Which of the cooperative method's mechanisms pay? Each one off (or swapped for its
plain counterpart) against the full method, at equal FLOPs, paired over seeds
(``benchmarks/bench_ablation.py`` is its command line).

The runs are :mod:`.methods`' (the same scenarios, sizes, simulator in numeric mode,
every Compute FLOP counted); the "full" row is the task's cooperative scenario with the
program's defaults. Each variant changes one mechanism (:data:`VARIANTS`); where that
changes the compute (no peer forwards, a replay pool, ...) its training steps are scaled
so its counted FLOPs match the full method's at lr x1 (:func:`equal_steps`).

A variant's cell: its deployed model's test metric, mean over seeds, and the paired
difference variant - full with its 95% interval: "full better" when the interval lies
below 0, "variant better" when above, "tie" when it includes 0. For a row that switches
a mechanism off, "full better" means the mechanism pays; for a row that adds one
("+ ..."), "full better" means adding it costs (:func:`pays`).
"""
from __future__ import annotations

import statistics

from ..reporting import stats
from . import methods as M

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
    "lean validators": ("validators score on 1% of a round's FLOPs, not 10%: the rest goes to training",
                        ["cooperation.roles.validation_share=0.01"]),
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


def variant_scenario(task: str, variant: str, seed: int, lr: float, size: str, steps: int | None = None):
    """The cooperative scenario of ``task`` with ``variant``'s overrides."""
    return M.scenario(task, "oresearcher", seed, lr, size, steps, VARIANTS[variant][1])


def run_variant(task: str, variant: str, seed: int, lr: float, size: str, steps: int | None = None) -> dict:
    """One cooperative run with ``variant``'s overrides (:func:`.methods.run_one`'s fields)."""
    return M.run_one(task, "oresearcher", seed, lr, size, steps, VARIANTS[variant][1])


def equal_steps(task: str, variant: str, seed: int, size: str, target: float) -> int | None:
    """Training steps that bring ``variant`` to ``target`` FLOPs (None: the full's own):
    a calibration run at the full's steps, the steps scaled by the FLOP ratio, and where
    that misses by more than 3% (the FLOPs are not linear in the steps: fusion rounds,
    validation and distillation are per round or per run) one secant step from both runs."""
    n = M.size_of(task, size)[0]
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
    return stats.paired(rows, full, key)


def run_task(task: str, seeds: list[int], size: str, lrs=M.LR_MULTS, log=print, pool=None, only=None) -> dict:
    """{lr: {variant: [run per seed]}} for ``only`` (default every variant of the task) and the full method."""
    starmap = M.starmap_of(pool)
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
            log(f"  {task} lr x{lr:g} {v}: model {stats.mean_or_nan([r['model'] for r in ok]):.4f}, "
                f"{len(ok)}/{len(seeds)} ran")
    return {"target_flops": target, "steps": steps, "runs": out}


def verdict_word(d) -> str:
    """Which side of the paired difference (variant - full) the interval puts ahead."""
    return stats.verdict_word(d, above="variant better", below="full better", holds_zero="tie")


def pays(variant: str, d) -> str:
    """What a row's interval says about its mechanism: the mechanism a row switches off
    ("no ...", "plain ...") pays where the full method is better; the one a row adds
    ("+ ...", off by default) pays where the variant is better."""
    word = verdict_word(d)
    if word in ("tie", "n/a"):
        return word
    adds = variant.startswith("+")
    return "pays" if (word == "variant better") == adds else "costs"


SAME = ("model", "agents", "flops", "curve")  # what two runs must share to count as one run


def same_runs(rows: list[dict], full: list[dict]) -> bool:
    """Every seed's run equals the full method's: deployed and agents' metrics, counted
    FLOPs and the metric's curve against simulated time."""
    return len(rows) == len(full) and all("error" not in a and all(a.get(k) == b.get(k) for k in SAME)
                                          for a, b in zip(rows, full))


def cell(variant: str, rows: list[dict], full: list[dict]) -> str:
    """A summary cell: "same" where the variant ran the full method's runs, else :func:`pays`."""
    return "same" if same_runs(rows, full) else pays(variant, paired_diff(rows, full))


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
            cells.append(" / ".join(cell(v, runs[lr][v], runs[lr]["full"]) if v in runs.get(lr, {})
                                    else "-" for lr in sorted(runs)))
        out(f"| {v} | " + " | ".join(cells) + " |")
    out("\npays: the mechanism the row switches off ('no ...', 'plain ...': the default has it) or adds ('+ ...': "
        "off by default) improves the deployed model, the paired 95% interval over the seeds excluding 0; "
        "costs: it makes it worse; tie: the interval holds 0; same: every seed's run is the full method's "
        "(metrics, FLOPs and curve: the setting changes nothing there); -: not applicable to the task")
