"""The communication-overhead controller against fixed sharing intervals.

    OMP_NUM_THREADS=1 python benchmarks/bench_budget.py                 # all, ~12 min on 2 busy cores
    OMP_NUM_THREADS=1 python benchmarks/bench_budget.py --tasks none     # the cost table alone
    OMP_NUM_THREADS=1 python benchmarks/bench_budget.py --tasks lm --seeds 1
    OMP_NUM_THREADS=1 python benchmarks/bench_budget.py --tasks lm --lm-steps 768 --rows key --curve  # ~18 min

Cost (shape mode, ``scenarios/8xA100.yaml``, ``--steps`` steps, fusion every 100): the
gradient shared every 1, 10, 100 or 1000 local steps (``communication.share_every``),
against ``communication.budget`` (the controller of :mod:`oresearcher.cooperation.budget`; the same
fusion rounds). Per step and rank: step time, exposed communication, overhead, time
waiting for slower peers and wire bytes, as ``python -m oresearcher.sim`` reports them.

Quality (numeric mode in the simulator, seeds 0-2; final metric: mean of the 4 agents,
then mean +- std over seeds), with overhead and bytes, the same fixed intervals and the
controller at the same budget, once with the shipped SWA optimizers, once with SAM
optimizers (two passes a step: the reference's imbalance):

- ``scenarios/digits-4.yaml``, 200 steps, fusion every 25: test accuracy;
- synthetic-lm (``scenarios/cpu-tiny.yaml``: gpt-tiny, the smallest preset, 0.8M
  parameters; numeric, 16-token sequences, 4 per agent, the cooperative settings of
  digits-4), 48 steps, fusion every 12 (4 rounds: 3 controller decisions): next-token
  accuracy of each agent's final model on a held-out stream of the same Markov chain
  (8 x 32 sequences: 4,096 tokens). 48 steps is early in training: "share every 1"
  reaches ~0.84 and sharing once a round ~0.57, so a controller that shared too little
  would show (the chain's ceiling is ~0.9).

``--lm-steps N`` runs synthetic-lm for N steps instead (fusion still every 12: N / 12
rounds), to measure the final metric where training has converged; ``--rows key`` keeps
only the two quality rows that matter ("share every 1" and the controller) so a long
horizon fits in time; ``--curve`` adds, per configuration, the agents' training loss by
round (mean over agents and seeds; shown every ``--curve-every`` rounds) and the
controller's decisions (seed 0, rank 0: rung, widening, codec) to see that training has
flattened and what the controller did.

Time to target (the console tables' last column): the simulated time until the end of
the first fusion round whose agents' mean training loss is at or below a common target,
the highest final training loss of any configuration (each the mean over its seeds), so
that every configuration reaches it by its end on average; median over seeds, and its
ratio to sharing every step's. The simulated clock is the one the overhead is
measured on, so a configuration that shares less reaches a loss sooner if its steps
are cheaper by more than its training is slower. The defaults (48 steps, all rows) are what the
README blocks hold.

Verdict of every row against "share every 1": the difference of the means, and "within
noise" when it is at most twice the pooled seed std (sqrt of the mean of the two
variances), else "loss" or "gain".
The figure (``--plot``): overhead and wire bytes per configuration, and both accuracies.

The runs, curves and times to target are oresearcher/experiments/budget.py's; this script
is their command line, tables and figure.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from oresearcher.experiments.budget import (LM_INTERVAL, LM_STEPS, METHODS, configs, cost_row,
                                            quality_rows, ttt_cell)

TASKS = {"digits": "digits-4 (numeric, 200 steps, fusion every 25): final test accuracy",
         "lm": f"synthetic-lm gpt-tiny (numeric, {LM_STEPS} steps, fusion every {LM_INTERVAL}): "
               "held-out next-token accuracy"}


def verdict(row: dict, ref: dict) -> str:
    """The row's mean against the reference's: "within noise" when the difference is at
    most twice the pooled seed std, else "loss" or "gain"."""
    d = row["acc"] - ref["acc"]
    noise = 2 * math.sqrt((row["acc_sd"] ** 2 + ref["acc_sd"] ** 2) / 2)
    word = "within noise" if abs(d) <= noise else "loss" if d < 0 else "gain"
    return f"{d:+.4f} ({word}, 2sd {noise:.4f})"


def quality_cells(rows: dict) -> dict[str, list[str]]:
    """name -> [accuracy, verdict, overhead, bytes] as the tables show them."""
    ref = rows["share every 1"]
    return {name: [f"{r['acc']:.4f} +- {r['acc_sd']:.4f}", "reference" if r is ref else verdict(r, ref),
                   f"{r['overhead']:.2%}", f"{r['bytes'] / 1e3:,.1f} kB"] for name, r in rows.items()}


def markdown(task: str, quality: dict) -> str:
    """The README block of one task: SWA and SAM side by side; rows whose cells are all
    equal share a line."""
    cells = {}
    for method in METHODS:
        for name, row in quality_cells(quality[method]).items():
            cells[name] = cells.get(name, []) + row
    merged: list[list] = []
    for name, row in cells.items():
        if merged and merged[-1][1] == row and name.startswith("share every"):
            merged[-1][0] += " / " + name.removeprefix("share every ")
        else:
            merged.append([name, row])
    label, metric = ("digits-4", "test accuracy") if task == "digits" else ("synthetic-lm", "next-token accuracy")
    head = [f"| {label} | " + " | ".join(f"{m.upper()}: {metric} | vs share every 1 | overhead | wire bytes / step"
                                        for m in METHODS) + " |", "|---" * (1 + 4 * len(METHODS)) + "|"]
    return "\n".join(head + [f"| {n} | " + " | ".join(r) + " |" for n, r in merged]) + "\n"


def readme_block(task: str) -> str:
    """What readme_figures.py writes between ``<!-- fig:budget-digits -->`` (or -lm) markers."""
    return markdown(task, {m: quality_rows(task, m, 0.083, [0, 1, 2]) for m in METHODS})


def cost_table(rows: dict, steps: int) -> Table:
    t = Table(title=f"8xA100 (shape mode, {steps} steps): per step and rank")
    for c in ("configuration", "step time", "exposed", "waiting", "overhead", "wire bytes", "controller rungs"):
        t.add_column(c, justify="left" if c in ("configuration", "controller rungs") else "right")
    for name, r in rows.items():
        ms = [f"{r[k] * 1e3:,.1f} ms" for k in ("step_s", "exposed_s", "wait_s")]
        t.add_row(name, *ms, f"{r['overhead']:.2%}", f"{r['bytes'] / 1e9:.3f} GB", ", ".join(r["rungs"]) or "-")
    return t


def task_title(task: str, lm_steps: int = LM_STEPS) -> str:
    if task == "lm":
        return (f"synthetic-lm gpt-tiny (numeric, {lm_steps} steps, fusion every {LM_INTERVAL}): "
                "held-out next-token accuracy")
    return TASKS[task]


def quality_table(task: str, rows: dict, seeds: list[int], method: str, lm_steps: int = LM_STEPS) -> Table:
    ref = rows["share every 1"]
    t = Table(title=f"{task_title(task, lm_steps)}, {method} optimizers, seeds {seeds}",
              caption=f"time to target: simulated time until the agents' mean training loss of a round is at or "
                      f"below {ref['target']:.4f} (the highest final loss of any row, mean over seeds), median "
                      "over seeds, and its ratio to sharing every step's")
    for c in ("configuration", "accuracy", "vs share every 1", "overhead", "wire bytes / step", "time to target"):
        t.add_column(c, justify="left" if c == "configuration" else "right")
    for name, cells in quality_cells(rows).items():
        t.add_row(name, *cells, ttt_cell(rows[name], ref))
    return t


def curve_table(rows: dict, method: str, every: int) -> Table:
    """One line per shown round (every ``every``-th and the last): each configuration's
    training loss, and the controller's decision at the end of that round."""
    n = min(len(r["curve"]) for r in rows.values())
    shown = sorted({*range(0, n, max(1, every)), n - 1})
    t = Table(title=f"{method} optimizers: the agents' training loss by round (mean over agents and seeds), "
                    "the controller's decision after the round (seed 0, rank 0: rung w codec)")
    t.add_column("round", justify="right")
    for name in rows:
        t.add_column(f"{name}: loss", justify="right")
    with_dec = [name for name, r in rows.items() if r["decisions"]]
    for name in with_dec:
        t.add_column(f"{name}: decision")
    for i in shown:
        t.add_row(str(i), *(f"{r['curve'][i]:.3f}" for r in rows.values()),
                  *(rows[name]["decisions"][i] if i < len(rows[name]["decisions"]) else "-" for name in with_dec))
    return t


def plot(cost: dict, quality: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 + len(quality), figsize=(5 * (2 + len(quality)), 4))
    names = list(cost)
    axes[0].bar(names, [cost[n]["overhead"] * 100 for n in names], color="tab:red")
    axes[0].set_ylabel("communication overhead (%)")
    axes[0].set_title("8xA100, shape mode")
    axes[1].bar(names, [cost[n]["bytes"] / 1e9 for n in names], color="tab:blue")
    axes[1].set_ylabel("wire bytes per step and rank (GB)")
    axes[1].set_title("8xA100, shape mode")
    for ax, (task, by_method) in zip(axes[2:], quality.items()):
        for i, (method, rows) in enumerate(by_method.items()):
            q = list(rows)
            ax.errorbar([x + 0.1 * i for x in range(len(q))], [rows[n]["acc"] for n in q],
                        yerr=[rows[n]["acc_sd"] for n in q], fmt="o", label=f"{method.upper()} optimizers")
            ax.set_xticks(range(len(q)), q)
        ax.legend()
        ax.set_ylabel("final accuracy (mean of agents)")
        ax.set_title(("digits-4" if task == "digits" else "synthetic-lm") + ", numeric mode")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    from oresearcher.files import save_figure

    save_figure(fig, path, dpi=110)  # atomic, never through a link


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="8xA100 steps (two fusion rounds at 200)")
    ap.add_argument("--budget", type=float, default=0.083, help="communication.budget of the controller rows")
    ap.add_argument("--seeds", type=int, default=3, help="quality seeds 0..N-1")
    ap.add_argument("--tasks", default="digits,lm", help="quality tasks, comma-separated: digits, lm (or none)")
    ap.add_argument("--lm-steps", type=int, default=LM_STEPS,
                    help=f"synthetic-lm steps (fusion every {LM_INTERVAL}; default {LM_STEPS}, the README's)")
    ap.add_argument("--rows", choices=("all", "key"), default="all",
                    help="quality rows: all, or key (share every 1 and the controller only)")
    ap.add_argument("--curve", action="store_true",
                    help="also print the training loss by round and the controller's decisions")
    ap.add_argument("--curve-every", type=int, default=4, help="--curve: show every N-th round (and the last)")
    ap.add_argument("--plot", type=Path, default=Path("runs/bench_budget/budget.png"))
    args = ap.parse_args()
    tasks = [t for t in args.tasks.split(",") if t and t != "none"]
    if any(t not in TASKS for t in tasks):
        ap.error(f"--tasks: unknown task in {args.tasks!r} (known: {', '.join(TASKS)})")
    if args.lm_steps < LM_INTERVAL or args.lm_steps % LM_INTERVAL:
        ap.error(f"--lm-steps: {args.lm_steps} is not a positive multiple of the fusion interval {LM_INTERVAL}")
    if args.seeds < 1 or args.curve_every < 1:
        ap.error("--seeds and --curve-every must be at least 1")
    out, t0 = Console(width=150), time.perf_counter()
    cost = {name: cost_row(sets, args.steps) for name, sets in configs(args.budget)}
    out.print(cost_table(cost, args.steps))
    seeds, quality = list(range(args.seeds)), {}
    for task in tasks:
        quality[task] = {}
        for method in METHODS:
            quality[task][method] = quality_rows(task, method, args.budget, seeds, args.rows, args.lm_steps)
            out.print(quality_table(task, quality[task][method], seeds, method.upper(), args.lm_steps))
            if args.curve:
                out.print(curve_table(quality[task][method], method.upper(), args.curve_every))
    plot(cost, quality, args.plot)
    out.print(f"wrote {args.plot} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
