"""The communication-overhead controller (:mod:`oresearcher.cooperation.budget`) against
fixed sharing intervals: the runs, the training curves by fusion round and the time to a
common target (``benchmarks/bench_budget.py`` is its command line and tables).

Cost: the reference scenario in shape mode, one row per configuration
(:func:`cost_row`). Quality: digits-4 and synthetic-lm in numeric mode, per seed
(:func:`quality_row`): the final metric (mean over the agents), overhead, wire bytes,
the agents' mean training loss by round and the controller's decisions.

Time to target: the simulated time until the end of the first fusion round whose agents'
mean training loss is at or below a common target, the highest final training loss of
any configuration (each the mean over its seeds), so that every configuration reaches
it by its end on average (:func:`with_time_to_target`).
"""
from __future__ import annotations

import math
import statistics

from ..scenario import load_scenario
from ..scenario.shipped import find_scenario
from ..sim.simulate import simulate
from .counted import instrumented, lm_eval_fn, metric_of
from .methods import COOP  # digits-4's cooperative settings

REFERENCE, DIGITS, LM = "scenarios/8xA100.yaml", "scenarios/digits-4.yaml", "scenarios/cpu-tiny.yaml"
INTERVALS = (1, 10, 100, 1000)
METHODS = ("swa", "sam")
LM_STEPS, LM_INTERVAL = 48, 12


def lm_sets(steps: int = LM_STEPS) -> list[str]:
    """The synthetic-lm scenario's overrides at ``steps`` steps (fusion every LM_INTERVAL)."""
    return ["simulation.mode=numeric", "training.strategy=oresearcher", "workload.seq_len=16", "training.lr=0.003",
            f"training.steps={steps}", f"communication.interval={LM_INTERVAL}",
            "agents.roles={explorer: 1, optimizer: 2, validator: 1}", *COOP]


LM_SETS = lm_sets()
HELD_OUT = (8, 32)  # held-out batches x sequences (x 16 tokens: 4,096 next-token predictions)


def configs(budget: float, rows: str = "all") -> list[tuple[str, list[str]]]:
    """(name, overrides) of the fixed intervals and the controller; ``rows="key"`` keeps
    "share every 1" (the reference) and the controller only."""
    every = INTERVALS if rows == "all" else INTERVALS[:1]
    # the fixed rows run without the controller, whatever the scenario says (the reference
    # scenario itself runs it: scenarios/8xA100.yaml)
    return [(f"share every {k}", [f"communication.share_every={k}", "communication.budget=null"]) for k in every] + [
        (f"controller, budget {budget:g}", [f"communication.budget={budget}"])]


def round_curve(report: dict) -> list[tuple[float, float]]:
    """(simulated seconds at the round's end: its last rank's, the agents' mean training
    loss) for each fusion round (by the metrics' ``round``), in round order."""
    by_round: dict[int, list[float]] = {}
    ends: dict[int, float] = {}
    for ms in report["metrics"].values():
        for m in ms:
            if "round" in m and math.isfinite(float(m.get("loss", math.nan))):
                by_round.setdefault(int(m["round"]), []).append(float(m["loss"]))
                if "time_s" in m:
                    ends[int(m["round"])] = max(ends.get(int(m["round"]), 0.0), float(m["time_s"]))
    return [(ends.get(r, math.nan), statistics.fmean(by_round[r])) for r in sorted(by_round)]


def round_losses(report: dict) -> list[float]:
    """The agents' mean training loss in each fusion round, in round order: the training
    curve of one run, to see whether it has flattened."""
    return [loss for _, loss in round_curve(report)]


def time_to_target(curve: list[tuple[float, float]], target: float) -> float:
    """Simulated seconds until the end of the first round whose mean training loss is at
    or below ``target`` (inf: never within the run)."""
    return next((t for t, loss in curve if loss <= target), math.inf)


def with_time_to_target(rows: dict) -> dict:
    """Adds ``target`` (the common target: the highest final training loss of any row,
    each row's the mean over its seeds, so every row reaches it on average by its end)
    and each row's ``ttt`` (per seed: :func:`time_to_target`, simulated seconds) to rows
    of one task and method; a seed that ends above it shows inf."""
    target = max(statistics.fmean(c[-1][1] for c in r["curves"]) for r in rows.values())
    for r in rows.values():
        r["target"], r["ttt"] = target, [time_to_target(c, target) for c in r["curves"]]
    return rows


def ttt_cell(row: dict, ref: dict) -> str:
    """Median time to target over seeds (ms, simulated) and its ratio to the reference's."""
    reached = [t for t in row["ttt"] if math.isfinite(t)]
    if len(reached) * 2 <= len(row["ttt"]):
        return f"not reached (reached in {len(reached)} of {len(row['ttt'])} seeds)"
    med, ref_med = statistics.median(row["ttt"]), statistics.median(ref["ttt"])
    notes = [f"{med / ref_med:.2f}x"] if math.isfinite(ref_med) else []
    if len(reached) < len(row["ttt"]):
        notes.append(f"{len(row['ttt']) - len(reached)} seed(s) not")
    return f"{med * 1e3:,.1f} ms ({', '.join(notes)})"


def decisions(report: dict) -> list[str]:
    """The controller's decision after each round as rank 0 logged it ("rung w codec"),
    empty for a fixed interval."""
    return [f"{int(m['budget_rung'])} w{m['budget_widen']:g} {m.get('budget_codec') or 'fp32'}"
            for m in report["metrics"]["0"] if "budget_rung" in m]


def cost_row(sets: list[str], steps: int) -> dict:
    """Per step and rank on the reference scenario: step time, exposed communication,
    overhead, time waiting for slower peers, wire bytes, and the controller's rungs."""
    r, _ = simulate(load_scenario(find_scenario(REFERENCE), sets + [f"training.steps={steps}"]))
    return {"step_s": r["step_time_s"], "exposed_s": r["exposed_comm_time_s"], "overhead": r["comm_overhead"],
            "wait_s": r["peer_wait_time_s"], "bytes": r["wire_bytes_per_step"],
            "rungs": sorted({m.get("budget_codec", "") + f" w={m['budget_widen']:g}"
                             for m in r["metrics"]["0"] if "budget_rung" in m})}


def digits_run(sets: list[str], seed: int) -> tuple[dict, float]:
    """(report, final test accuracy: mean of the agents) of one digits-4 run."""
    r, _ = simulate(load_scenario(find_scenario(DIGITS), sets + [f"seed={seed}"]))
    return r, statistics.fmean(ms[-1]["test_accuracy"] for ms in r["metrics"].values())


def lm_run(sets: list[str], seed: int, steps: int = LM_STEPS) -> tuple[dict, float]:
    """(report, held-out next-token accuracy of the agents' final models, their mean) of
    one synthetic-lm run of ``steps`` steps; the learners are kept (:func:`.counted.instrumented`)
    and scored after the run."""
    sc = load_scenario(find_scenario(LM), lm_sets(steps) + sets + [f"seed={seed}"])
    with instrumented() as got:
        r, _ = simulate(sc)
    held_out = lm_eval_fn(sc, *HELD_OUT)
    for learner in got["learners"]:
        learner.eval_fn = held_out
    return r, statistics.fmean(metric_of(learner) for learner in got["learners"])


RUNS = {"digits": digits_run, "lm": lm_run}


def quality_row(task: str, sets: list[str], seeds: list[int], lm_steps: int = LM_STEPS) -> dict:
    """Accuracy (each seed, mean, std), overhead and bytes of one configuration over the
    seeds, with the training curve (:func:`round_losses`, mean over seeds) and seed
    ``seeds[0]``'s controller decisions."""
    acc, ovh, byt, curves, dec = [], [], [], [], []
    for seed in seeds:
        r, a = lm_run(sets, seed, lm_steps) if task == "lm" else RUNS[task](sets, seed)
        acc.append(a)
        ovh.append(r["comm_overhead"])
        byt.append(r["wire_bytes_per_step"])
        curves.append(round_curve(r))
        dec = dec or decisions(r)
    sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
    curve = [statistics.fmean(c[i][1] for c in curves) for i in range(min(map(len, curves)))]
    return {"accs": acc, "acc": statistics.fmean(acc), "acc_sd": sd, "overhead": statistics.fmean(ovh),
            "bytes": statistics.fmean(byt), "curve": curve, "curves": curves, "decisions": dec}


def quality_rows(task: str, method: str, budget: float, seeds: list[int], rows: str = "all",
                 lm_steps: int = LM_STEPS) -> dict:
    """Every configuration's :func:`quality_row` with ``method`` optimizers, with their
    time to the common target."""
    return with_time_to_target({name: quality_row(task, sets + [f"cooperation.roles.optimizer_method={method}"],
                                                  seeds, lm_steps) for name, sets in configs(budget, rows)})
