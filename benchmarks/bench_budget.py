"""The communication-overhead controller against fixed sharing intervals.

    OMP_NUM_THREADS=1 python benchmarks/bench_budget.py                 # both parts, ~2 min on 2 busy cores
    OMP_NUM_THREADS=1 python benchmarks/bench_budget.py --steps 40 --seeds 1

Cost (shape mode, ``scenarios/8xA100.yaml``, ``--steps`` steps, fusion every 100): the
gradient shared every 1, 10, 100 or 1000 local steps (``communication.share_every``),
against ``communication.budget`` (the controller of :mod:`oresearcher.cooperation.budget`; the same
fusion rounds). Per step and rank: step time, exposed communication, overhead, time
waiting for slower peers and wire bytes, as ``python -m oresearcher.sim`` reports them.

Quality (numeric mode in the simulator, ``scenarios/digits-4.yaml``, 200 steps, seeds
0-2): the same fixed intervals and the controller at the same budget; final test
accuracy (mean of the 4 agents, then mean +- std over seeds), overhead and bytes; once
with the shipped SWA optimizers, once with SAM optimizers (two passes a step: the
reference's imbalance).
The figure (``--plot``): overhead and wire bytes per configuration, both parts.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import simulate

REFERENCE, DIGITS = "scenarios/8xA100.yaml", "scenarios/digits-4.yaml"
INTERVALS = (1, 10, 100, 1000)


def configs(budget: float) -> list[tuple[str, list[str]]]:
    return [(f"share every {k}", [f"communication.share_every={k}"]) for k in INTERVALS] + [
        (f"controller, budget {budget:g}", [f"communication.budget={budget}"])]


def cost_row(sets: list[str], steps: int) -> dict:
    r, _ = simulate(load_scenario(REFERENCE, sets + [f"training.steps={steps}"]))
    return {"step_s": r["step_time_s"], "exposed_s": r["exposed_comm_time_s"], "overhead": r["comm_overhead"],
            "wait_s": r["peer_wait_time_s"], "bytes": r["wire_bytes_per_step"],
            "rungs": sorted({m.get("budget_codec", "") + f" w={m['budget_widen']:g}"
                             for m in r["metrics"]["0"] if "budget_rung" in m})}


def quality_row(sets: list[str], seeds: list[int]) -> dict:
    acc, ovh, byt = [], [], []
    for seed in seeds:
        r, _ = simulate(load_scenario(DIGITS, sets + [f"seed={seed}"]))
        last = [ms[-1] for ms in r["metrics"].values()]
        acc.append(statistics.fmean(m["test_accuracy"] for m in last))
        ovh.append(r["comm_overhead"])
        byt.append(r["wire_bytes_per_step"])
    sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
    return {"acc": statistics.fmean(acc), "acc_sd": sd, "overhead": statistics.fmean(ovh),
            "bytes": statistics.fmean(byt)}


def cost_table(rows: dict, steps: int) -> Table:
    t = Table(title=f"8xA100 (shape mode, {steps} steps): per step and rank")
    for c in ("configuration", "step time", "exposed", "waiting", "overhead", "wire bytes", "controller rungs"):
        t.add_column(c, justify="left" if c in ("configuration", "controller rungs") else "right")
    for name, r in rows.items():
        ms = [f"{r[k] * 1e3:,.1f} ms" for k in ("step_s", "exposed_s", "wait_s")]
        t.add_row(name, *ms, f"{r['overhead']:.2%}", f"{r['bytes'] / 1e9:.3f} GB", ", ".join(r["rungs"]) or "-")
    return t


def quality_table(rows: dict, seeds: list[int], method: str) -> Table:
    t = Table(title=f"digits-4, {method} optimizers (numeric mode, 200 steps, seeds {seeds}): final test accuracy")
    for c in ("configuration", "test accuracy", "overhead", "wire bytes / step"):
        t.add_column(c, justify="left" if c == "configuration" else "right")
    for name, r in rows.items():
        t.add_row(name, f"{r['acc']:.4f} +- {r['acc_sd']:.4f}", f"{r['overhead']:.2%}", f"{r['bytes'] / 1e3:,.1f} kB")
    return t


def plot(cost: dict, quality: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    names = list(cost)
    axes[0].bar(names, [cost[n]["overhead"] * 100 for n in names], color="tab:red")
    axes[0].set_ylabel("communication overhead (%)")
    axes[0].set_title("8xA100, shape mode")
    axes[1].bar(names, [cost[n]["bytes"] / 1e9 for n in names], color="tab:blue")
    axes[1].set_ylabel("wire bytes per step and rank (GB)")
    axes[1].set_title("8xA100, shape mode")
    for i, (method, rows) in enumerate(quality.items()):
        q = list(rows)
        axes[2].errorbar([x + 0.1 * i for x in range(len(q))], [rows[n]["acc"] for n in q],
                         yerr=[rows[n]["acc_sd"] for n in q], fmt="o", label=f"{method.upper()} optimizers")
        axes[2].set_xticks(range(len(q)), q)
    axes[2].legend()
    axes[2].set_ylabel("final test accuracy (mean of agents)")
    axes[2].set_title("digits-4, numeric mode")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="8xA100 steps (two fusion rounds at 200)")
    ap.add_argument("--budget", type=float, default=0.083, help="communication.budget of the controller rows")
    ap.add_argument("--seeds", type=int, default=3, help="digits seeds 0..N-1")
    ap.add_argument("--plot", type=Path, default=Path("runs/bench_budget/budget.png"))
    args = ap.parse_args()
    out, t0 = Console(width=150), time.perf_counter()
    cost = {name: cost_row(sets, args.steps) for name, sets in configs(args.budget)}
    out.print(cost_table(cost, args.steps))
    seeds = list(range(args.seeds))
    quality = {}
    for method in ("swa", "sam"):
        quality[method] = {name: quality_row(sets + [f"cooperation.roles.optimizer_method={method}"], seeds)
                           for name, sets in configs(args.budget)}
        out.print(quality_table(quality[method], seeds, method.upper()))
    plot(cost, quality, args.plot)
    out.print(f"wrote {args.plot} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
