"""Sim-to-real: the simulator's prediction, with profiles calibrated on this machine,
beside real gloo runs of the same scenarios.

    OMP_NUM_THREADS=1 python benchmarks/bench_sim_to_real.py              # about 5 minutes
    OMP_NUM_THREADS=1 python benchmarks/bench_sim_to_real.py --repeats 1 --markdown

For each configuration and repeat it runs ``python -m oresearcher.calibrate``
(collective sweep + the workload's step with all ranks busy) into a profile, right
away a real run (``python -m oresearcher.run --backend=gloo``), and the simulator
(``oresearcher.sim.simulate.simulate``) on the identical scenario pointed at that
profile. The calibration is a separate launch (its own processes, a short run of the
program): nothing of the run being predicted feeds its prediction. Calibrating next to each run keeps both under the same load from whatever
else the machine is doing. Configurations (gpt-tiny, ~0.8M parameters, on the synthetic
token stream):

1. ddp: all-reduce of the gradients every step;
2. local_sgd: averaging the parameters every 10 steps (300 steps: 30 averagings, as
   the wait at each one is a noisy draw);
3. oresearcher with an int8 codec: every step the agents share int8-compressed
   gradients by the two-phase all-reduce (an all-to-all of compressed chunks, each rank
   sums its chunk, then a compressed all-gather; one fusion round at the end).

It prints predicted and measured step time and communication overhead with the
relative error of each (target: within 15 %). The measured figures are the steady
ones, over the steps after the first two (calibrate leaves out two as well): the first
steps hold the run's warm-up, which the simulator does not price (``steady``); each
configuration's line prints the run's own figures with them too. It compares the
median prediction with the median measurement over ``--repeats`` (the machine is shared; medians resist a
neighbour's burst). "run spread" is (max - min) / median of the repeated real runs: the
machine's own noise, the floor under any prediction error. The load average before and
after is printed with the table; for each calibrate/run pair, the share of CPU time the
hypervisor took (``cpu_ticks``) and the rank split: how much the slowest rank's compute
per step exceeds the fastest's (``rank_split``), in the calibration and in the run. A run
whose ranks split more than its calibration's waits at every collective for a rank the
prediction did not see.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from oresearcher.calibration.band import cpu_ticks, stolen  # CPU time the hypervisor took
from oresearcher.errors import UserError
from oresearcher.reporting.compare import band_verdicts  # a calibrated prediction's band, inside or not
from oresearcher.reporting.round_ops import WARMUP, rank_split, steady, trace_spans  # a real run's steady figures
from oresearcher.files import write_text

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "name": "sim2real",
    "seed": 0,
    "cluster": {"nodes": 1, "gpus_per_node": 4, "device": "cpu-local", "intra_node": "loopback"},
    "workload": {"task": "synthetic-lm", "model": "gpt-tiny", "global_batch": 8, "seq_len": 64,
                 "dtype": "fp32", "optimizer": "adamw"},
    "agents": {"count": 2},
    "communication": {"bucket_size_MB": 25, "overlap": False, "algorithm": "ring"},
    "training": {"strategy": "ddp", "steps": 40, "lr": 0.001, "local_steps": 10},
}

CONFIGS = [
    ("all-reduce every step (ddp)", 2, {"training": {"strategy": "ddp"}}),
    ("periodic averaging every 10 steps (local_sgd)", 2, {"training": {"strategy": "local_sgd", "steps": 300}}),
    ("int8 codec, two-phase all-reduce (oresearcher)", 2, {
        "training": {"strategy": "oresearcher"},
        "communication": {"codec": "int8", "gradient_sharing": True, "share_every": 1, "interval": 40},
        "cooperation": {"roles": {"policy": "plain"}, "allocation": {"enabled": False}},
    }),
]


def scenario_dict(n: int, extra: dict, global_batch_per_agent: int = 4) -> dict:
    data = copy.deepcopy(BASE)
    data["agents"]["count"] = n
    data["workload"]["global_batch"] = global_batch_per_agent * n  # the same work per agent at any n
    for section, fields in extra.items():
        data.setdefault(section, {}).update(copy.deepcopy(fields))
    return data


def sh(cmd: list, what: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{what} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")


def calibrate(path: Path, profile: Path, extra=()) -> None:
    sh([sys.executable, "-m", "oresearcher.calibrate", "--backend=gloo", "--scenario", str(path), "--out", str(profile),
        *extra], f"calibration with {path}")


def measure(path: Path, out: Path, per_collective: bool = False) -> dict:
    """A real gloo run of ``path``: its report over the steady steps (:func:`steady`);
    ``per_collective``: with ``blocked_by_name`` (:func:`real_blocked`)."""
    sh([sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--scenario", str(path), "--out", str(out),
        "--no-tensorboard", "--no-progress"], f"real run of {path}")
    try:
        report = steady(json.loads((out / "report.json").read_text()), out)
    except UserError as e:
        sys.exit(str(e))
    return dict(report, blocked_by_name=real_blocked(report, out)) if per_collective else report


def real_blocked(report: dict, run_dir: Path) -> dict:
    """Seconds per step each collective (by name) held a rank blocked, mean over ranks,
    over the steady steps (as :func:`steady` counts them)."""
    spans = trace_spans(json.loads((run_dir / "trace.json").read_text()))
    out = {}
    for r, ms in report["metrics"].items():
        t = [m["time_s"] for m in ms]
        for s, e, name, lane in spans[int(r)]:
            if lane == "blocked" and s >= t[WARMUP - 1]:
                out[name] = out.get(name, 0.0) + (e - s) / (len(t) - WARMUP) / len(report["metrics"])
    return out


def predict(path: Path, profile: Path, per_collective: bool = False) -> dict:
    """The simulator's report of ``path`` with ``profile``; ``per_collective``: with the
    seconds per step each collective held a rank blocked (``blocked_by_name``)."""
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.simulate import simulate

    scenario = load_scenario(path, [f"cluster.profile_files=[{profile}]", "cluster.device=cpu-calibrated",
                                    "cluster.intra_node=gloo-calibrated"])
    report, tl = simulate(scenario, **({"keep_spans": 10 ** 7} if per_collective else {}))  # every span, to sum
    if not per_collective:
        return report
    blocked = {}
    for sp in tl.spans:
        if sp.cat == "blocked":
            blocked[sp.name] = blocked.get(sp.name, 0.0) + (sp.end - sp.start) / report["steps"] / tl.world_size
    return dict(report, blocked_by_name=blocked)


def median_report(reports: list[dict], keys=("step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s",
                                             "comm_overhead", "wire_bytes_per_step", "peer_wait_time_s")) -> dict:
    return {k: statistics.median(r[k] for r in reports) for k in keys}


def spread(xs: list) -> float:
    """(max - min) / median of repeated measurements: the machine's own noise."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 and statistics.median(xs) else 0.0


def stolen_text(shares) -> str:
    """Stolen shares as percentages ("-" where unknown)."""
    return ", ".join("-" if x is None else f"{100 * x:.0f}" for x in shares)


def host_stolen(since) -> str:
    """"; N% of the CPU time stolen by the hypervisor" since a :func:`cpu_ticks` reading, or ""."""
    x = stolen(since, cpu_ticks())
    return "" if x is None else f"; {100 * x:.1f}% of the CPU time stolen by the hypervisor"


def calibration_split(profile: Path) -> float | None:
    """:func:`rank_split` of the compute per step each rank measured during calibration,
    read from the profile's header line (``per rank: a, b ms``); None where it has none."""
    try:
        found = re.search(r"per rank: ([0-9., ]+) ms;", profile.read_text())
    except OSError:
        return None
    return rank_split([float(x) for x in found.group(1).split(",")]) if found else None


def pairs_text(pairs) -> str:
    """(calibration, run) shares per pair as "c / r" percentages (:func:`stolen_text`),
    pairs joined by "; "."""
    return "; ".join(stolen_text(pair).replace(", ", " / ") for pair in pairs)


def err(pred: float, meas: float) -> float:
    return (pred - meas) / meas if meas else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                 epilog="configurations: 1 ddp, 2 local_sgd, 3 oresearcher with int8 "
                                        "(gpt-tiny on gloo; see the module docstring)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="calibrate+run pairs per configuration; the table compares medians (default 5)")
    ap.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    ap.add_argument("--only", type=int, nargs="*", metavar="N",
                    help="configuration numbers to run, 1-based (default: all three)")
    ap.add_argument("--calibrate-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for oresearcher.calibrate (e.g. --no-jitter, --no-in-run), repeatable")
    ap.add_argument("--per-collective", action="store_true",
                    help="also print, per configuration, the ms per step each collective holds a rank blocked "
                         "(peer wait and transfer), predicted against measured, each pair and the median")
    ap.add_argument("--keep", metavar="DIR",
                    help="write scenarios, profiles and runs to DIR (default: a new temporary directory)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1")
    if args.only and not set(args.only) <= set(range(1, len(CONFIGS) + 1)):
        ap.error(f"--only {' '.join(map(str, args.only))}: configurations are 1 to {len(CONFIGS)}")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sim2real-"))
    work.mkdir(parents=True, exist_ok=True)
    chosen = [(i, c) for i, c in enumerate(CONFIGS, 1) if not args.only or i in args.only]
    rows = []
    t0 = time.perf_counter()
    load_before, ticks0 = os.getloadavg()[0], cpu_ticks()
    for i, (label, n, extra) in chosen:
        path = work / f"config{i}.yaml"
        path.write_text(yaml.safe_dump(scenario_dict(n, extra), sort_keys=False))
        preds, meass, steal, split, verdicts = [], [], [], [], []
        for k in range(args.repeats):
            profile = work / f"profile{i}-{k}.yaml"
            c0 = cpu_ticks()
            calibrate(path, profile, args.calibrate_arg)
            c1 = cpu_ticks()
            meass.append(measure(path, work / f"run{i}-{k}", args.per_collective))
            steal.append((stolen(c0, c1), stolen(c1, cpu_ticks())))
            split.append((calibration_split(profile), rank_split(meass[-1]["compute_s_by_rank"])))
            preds.append(predict(path, profile, args.per_collective))
            verdicts.append(band_verdicts(preds[-1], meass[-1]))
            print_pair_band(k, verdicts[-1])
        pred, meas = median_report(preds), median_report(meass)
        rows.append({"config": label, "ranks": n, "pred": pred, "meas": meas,
                     "step_spread": spread([m["step_time_s"] for m in meass]),
                     "overhead_spread": spread([m["comm_overhead"] for m in meass]),
                     "step_err": err(pred["step_time_s"], meas["step_time_s"]),
                     "overhead_err": err(pred["comm_overhead"], meas["comm_overhead"]),
                     "stolen_calibrations": [c for c, _ in steal], "stolen_runs": [r for _, r in steal],
                     "rank_split_calibrations": [c for c, _ in split], "rank_split_runs": [r for _, r in split]})
        keys = ("step_time_s", "comm_overhead")
        first = median_report([{k: m[f"first_steps_{k}"] for k in keys} for m in meass], keys)
        print(f"[{time.perf_counter() - t0:5.0f} s] {label}: step {1e3 * pred['step_time_s']:.1f} vs "
              f"{1e3 * meas['step_time_s']:.1f} ms, overhead {pred['comm_overhead']:.1%} vs {meas['comm_overhead']:.1%} "
              f"(steps {WARMUP + 1}..; with the first {WARMUP}: {1e3 * first['step_time_s']:.1f} ms, "
              f"{first['comm_overhead']:.1%})", flush=True)
        if any(x is not None for pair in steal for x in pair):
            print(f"  CPU time stolen by the hypervisor, % per pair, calibration / run: "
                  f"{pairs_text(steal)}")
        if n > 1:
            print(f"  rank split (slowest rank's compute per step over the fastest's, % of the mean), per pair, "
                  f"calibration / run: {pairs_text(split)}")
        print_band_verdict(verdicts)
        if args.per_collective:
            print_blocked(preds, meass)
    print_table(rows, args.markdown)
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} cores; {args.repeats} repeat(s), medians{host_stolen(ticks0)}")
    write_text(work / "sim_to_real.json", json.dumps(rows, indent=1, default=float))
    print(f"scenarios, profiles, runs and sim_to_real.json in {work}")
    return 0 if all(abs(r["step_err"]) <= 0.15 and abs(r["overhead_err"]) <= 0.15 for r in rows) else 1


def print_pair_band(k: int, verdicts: list[dict]) -> None:
    """One calibrate-and-run pair: each headline figure measured, its predicted band, inside or not."""
    def cell(v):
        f = (lambda x: f"{1e3 * x:.1f} ms") if v["unit"] == "s" else (lambda x: f"{x:.1%}")
        w = "" if v["half_width"] is None else f" (+-{v['half_width']:.0%})"
        return f"{v['label']} {f(v['measured'])} in [{f(v['low'])}, {f(v['high'])}]{w}: " + (
            "inside" if v["inside"] else "OUTSIDE")
    if verdicts:
        print(f"  pair {k + 1}: " + "; ".join(cell(v) for v in verdicts), flush=True)


def print_band_verdict(per_pair: list[list[dict]]) -> None:
    """How many pairs' measured figures lie inside their predictions' bands, and whether the
    bands are narrow enough to be useful (+-20%)."""
    from oresearcher.calibration.band import USEFUL

    for label in ("step time", "overhead"):
        vs = [v for pair in per_pair for v in pair if v["label"] == label]
        if not vs:
            continue
        widths = [v["half_width"] for v in vs if v["half_width"] is not None]
        wide = statistics.median(widths) if widths else float("nan")
        print(f"  {label}: inside the predicted band in {sum(v['inside'] for v in vs)} of {len(vs)} pairs; "
              f"band half width median +-{wide:.0%}" + (f" (wider than +-{USEFUL:.0%})" if wide > USEFUL else ""))


def print_blocked(preds: list[dict], meass: list[dict]) -> None:
    """Per collective name: ms per step blocked, predicted / measured, each pair, then the
    medians; the names in order of the measured median, largest first."""
    names = {n for r in preds + meass for n in r["blocked_by_name"]}
    ms = lambda r, n: 1e3 * r["blocked_by_name"].get(n, 0.0)  # noqa: E731
    med = {n: (statistics.median(ms(p, n) for p in preds), statistics.median(ms(m, n) for m in meass)) for n in names}
    print("  blocked ms per step and rank, predicted / measured (each pair; median):")
    for n in sorted(names, key=lambda n: -med[n][1]):
        pairs = ", ".join(f"{ms(p, n):.1f}/{ms(m, n):.1f}" for p, m in zip(preds, meass))
        print(f"    {n:<22} {pairs}; {med[n][0]:.1f}/{med[n][1]:.1f}")


def print_table(rows, markdown: bool) -> None:
    head = ("configuration", "ranks", "step predicted", "step measured", "error", "run spread",
            "overhead predicted", "overhead measured", "error", "run spread")
    lines = []
    for r in rows:
        p, m = r["pred"], r["meas"]
        lines.append((r["config"], str(r["ranks"]), f"{1e3 * p['step_time_s']:.1f} ms", f"{1e3 * m['step_time_s']:.1f} ms",
                      f"{r['step_err']:+.1%}", f"{r['step_spread']:.0%}", f"{p['comm_overhead']:.1%}",
                      f"{m['comm_overhead']:.1%}", f"{r['overhead_err']:+.1%}", f"{r['overhead_spread']:.0%}"))
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for l in lines:
        print("  ".join(c.ljust(w) for c, w in zip(l, widths)))
    if markdown:
        print()
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for l in lines:
            print("| " + " | ".join(l) + " |")


if __name__ == "__main__":
    sys.exit(main())
