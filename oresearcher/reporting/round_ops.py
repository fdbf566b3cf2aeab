"""A run's time op by op, read from its Chrome trace and report.json (the simulator and
the gloo backend write both alike): where a hosted round's time goes on its critical rank
(benchmarks/bench_allocation.py prints it), and a real run's steady figures (benchmarks/
bench_sim_to_real.py compares them with the simulator).

A round of the hosted program (oresearcher/programs/cooperative_hosted.py) on one rank:
its agents' slices (swap in, forward+backward and optimizer steps, swap out), the stats
all-gather, packing the weights, the weights all-gather, fusion. The round ends when
the last rank reaches the stats all-gather, so the round's time is the time of the rank
that arrives there last (the *critical* rank: the one blocked there the least), op by
op. Both the simulator and the gloo backend write the same Chrome trace (``trace.json``:
one lane per rank for compute, one for blocked time) and the same per-round StepDone
times (``report.json``), so one reader serves both. What no span covers on the critical
rank is the Python between ops (the program's own code and the interpreter's
bookkeeping): the simulator charges it as the device profile's ``host_overhead_us``
per op.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from ..errors import UserError

# rows of the table: (label, span names)
ROWS = (("swap in + out", ("swap_in", "swap_out")),
        ("agent steps (forward+backward, optimizer)", ("fwd_bwd", "optimizer")),  # the rate folds both
        ("pack weights + stats", ("pack",)),
        ("round all-gather (the last to arrive)", ("round_gather",)),
        ("fusion", ("fusion",)))
GATHER = "round_gather"
GATHER_ROW = ROWS[3][0]
BETWEEN = "between ops (Python)"


def trace_spans(trace: dict) -> dict:
    """rank (int) -> [(start s, end s, name, lane)] of its compute and blocked lanes, from a
    Chrome trace as the simulator and the gloo backend write it (``trace.json``)."""
    lanes = {e["tid"]: e["args"]["name"].split() for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e["tid"] not in lanes:
            continue
        _, rank, lane = lanes[e["tid"]][:3]
        if lane in ("compute", "blocked"):
            name = e["name"].removeprefix("blocked:")
            out[int(rank)].append((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, name, lane))
    return out


def critical_rounds(run_dir: Path, skip_rounds: int = 1, host_s: float = 0.0) -> list[dict]:
    """Per round after the first ``skip_rounds``: seconds of each ROWS entry, the time
    between ops and the round's duration, on that round's critical rank. ``host_s``: the
    host overhead the simulator adds to each Compute span (moved to "between ops")."""
    report = json.loads((run_dir / "report.json").read_text())
    spans = trace_spans(json.loads((run_dir / "trace.json").read_text()))
    ends = {int(r): [m["time_s"] for m in ms] for r, ms in report["metrics"].items()}
    per_round = []
    for i in range(len(ends[0])):
        cand = {}
        for r, t in ends.items():
            lo, hi = (t[i - 1] if i else 0.0), t[i]
            got, ops, compute = defaultdict(float), 0, 0.0
            for s, e, name, lane in spans[r]:
                if lo <= s < hi:
                    own = max(0.0, e - s - (host_s if lane == "compute" else 0.0))
                    got[name] += own
                    if lane == "compute":
                        ops, compute = ops + 1, compute + own
            got["_round"], got["_ops"], got["_compute"] = hi - lo, ops, compute
            cand[r] = got
        crit = min(cand, key=lambda r: cand[r][GATHER])
        got = cand[crit]
        row = {label: sum(got[n] for n in names) for label, names in ROWS}
        row[BETWEEN] = got["_round"] - sum(v for k, v in got.items() if not k.startswith("_"))
        row["round"], row["compute"] = got["_round"], got["_compute"]
        mine = report["metrics"][str(crit)][i]  # the critical rank's own agents carry device_s
        own = timed_agents(mine)
        row["units"] = sum(mine[f"units.{a}"] for a in own)
        row["device_s"] = sum(mine[f"device_s.{a}"] for a in own)
        row["plan_unit_s"] = median_unit_s(report, i - 1) if i else float("nan")  # what round i was planned at
        row["steps"] = got["fwd_bwd"] + got["optimizer"]
        row["optimizer"] = got["optimizer"]
        row["rank"], row["compute_ops"] = crit, got["_ops"]
        per_round.append(row)
    return per_round[skip_rounds:]


def timed_agents(m: dict) -> list[str]:
    """The agents whose device time a rank's metrics row carries (its hosted agents)."""
    return [key.split(".")[1] for key in m if key.startswith("device_s.")]


def median_unit_s(report: dict, i: int) -> float:
    """Round ``i``'s median over agents of device seconds per unit run: the figure the
    metered scheduler plans the next round's seconds with (``Scheduler.plan`` takes the
    median of ``unit_seconds``, computed here by the scheduler's own function); nan where
    no agent reports device time (shape mode)."""
    from ..cooperation.scheduler import unit_seconds

    rows = [ms[i] for ms in report["metrics"].values()]
    agents = [(m, a) for m in rows for a in timed_agents(m)]
    est = unit_seconds([m[f"device_s.{a}"] for m, a in agents], [m[f"units.{a}"] for m, a in agents])
    return statistics.median(est) if est else float("nan")


def mean_ms(rows: list[dict]) -> dict:
    skip = ("rank", "compute_ops", "units", "device_s", "plan_unit_s")
    return {k: 1e3 * statistics.fmean(r[k] for r in rows) for k in rows[0] if k not in skip}


def table_lines(pred: dict, meas: dict) -> list[str]:
    """The op-by-op table of a round, predicted beside measured (ms per round)."""
    lines = ["op by op on each round's critical rank, ms per round (rounds 2..)  predicted  measured   error"]
    for label in [lab for lab, _ in ROWS] + [BETWEEN, "round"]:
        p, m = pred[label], meas[label]
        e = f"{(p - m) / m:+7.1%}" if m > 0.05 else ""
        lines.append(f"  {label if label != 'round' else 'round time':64s} {p:9.2f} {m:9.2f} {e}")
        if label == ROWS[1][0]:
            lines.append(f"    of which optimizer steps (the rate folds them into the FLOPs){'':14s}"
                         f"{meas['optimizer']:9.2f}")
    return lines


def plan_units(row: dict) -> float:
    """The units a critical round's device seconds are worth at the price the metered
    scheduler planned that round with (the previous round's median seconds per unit over
    all agents): the units the simulator hands that rank for the same seconds. A rank
    whose steps cost less than the median (one computing alone at the round's end) runs
    more steps than that in its seconds; counting its own steps would price the
    simulator's unit at the cheaper step. Before metering (no device seconds): its units."""
    if row["device_s"] > 0 and row["plan_unit_s"] > 0:
        return row["device_s"] / row["plan_unit_s"]
    return row["units"]


WARMUP = 2  # steps left out of a real run's measured step, as calibrate leaves out two


def steady(report: dict, run_dir: Path, warmup: int = WARMUP) -> dict:
    """A real run's report over its steps after the first ``warmup``: ``step_time_s`` (the
    slowest rank's, as the report's own figure), ``exposed_comm_time_s`` (the mean over
    ranks of the time blocked in communication, from the run's trace) and
    ``comm_overhead``, their ratio, and ``compute_s_by_rank`` (each rank's seconds in
    Compute ops per step: a rank that stays slower than the others sets the pace at every
    collective, see :func:`rank_split`). The first steps hold a run's warm-up (the first
    collectives' connections, lazy allocations, the optimizer's state created at its
    first step: 100-200 ms once here, several steps' worth), which the simulator does not
    price: every simulated step is the same. The report's own figures are kept with a
    ``first_steps_`` prefix."""
    ends = {r: [m["time_s"] for m in ms] for r, ms in report["metrics"].items()}
    if not ends or min(len(t) for t in ends.values()) <= warmup:
        raise UserError(f"a real run needs more than {warmup} steps to time its steady step")
    spans = trace_spans(json.loads((run_dir / "trace.json").read_text()))
    blocked = {r: sum(e - s for s, e, _, lane in spans[int(r)] if lane == "blocked" and s >= t[warmup - 1])
               for r, t in ends.items()}
    out = dict(report, **{f"first_steps_{k}": report[k]
                          for k in ("step_time_s", "exposed_comm_time_s", "comm_overhead")})
    out["step_time_s"] = max((t[-1] - t[warmup - 1]) / (len(t) - warmup) for t in ends.values())
    out["exposed_comm_time_s"] = sum(blocked[r] / (len(t) - warmup) for r, t in ends.items()) / len(ends)
    out["comm_overhead"] = out["exposed_comm_time_s"] / out["step_time_s"]
    out["compute_s_by_rank"] = {
        r: sum(e - s for s, e, _, lane in spans[int(r)] if lane == "compute" and s >= t[warmup - 1]) / (len(t) - warmup)
        for r, t in ends.items()}
    return out


def rank_split(per_rank) -> float:
    """How much the slowest rank's compute per step exceeds the fastest's, over the mean
    (0 where fewer than two ranks or no compute): ranks that differ this much for a whole
    run make the faster ones wait at every collective, which per-op jitter does not."""
    xs = list(per_rank.values()) if isinstance(per_rank, dict) else list(per_rank)
    mean = sum(xs) / len(xs) if xs else 0.0
    return (max(xs) - min(xs)) / mean if len(xs) > 1 and mean > 0 else 0.0
