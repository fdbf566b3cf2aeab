"""Hosted agents (cooperation.allocation.agents_per_device): the simulator's predicted
round time beside a real gloo run, op by op, and each agent's device time beside its shares.

    OMP_NUM_THREADS=1 python benchmarks/bench_allocation.py               # 3 repeats, about 2 minutes
    OMP_NUM_THREADS=1 python benchmarks/bench_allocation.py --repeats 1   # about 40 s

As the predict-then-measure chain (benchmarks/bench_sim_to_real.py), nothing of the run
being predicted feeds the prediction:

1. ``python -m oresearcher.calibrate --backend=gloo`` on the same scenario (its own
   launch): the fabric's fit to an idle sweep of collectives.
2. The host link a switch crosses: one agent's state copied out and back, median of 50
   (``host_link_GBps``; calibrate writes the same measurement, ``measure_host_link``).
3. A calibration run: its own launch of the same scenario (same program, same rounds,
   the same schedule), from whose trace, on each round's critical rank (the last to
   reach the round's all-gather; rounds 2..):

   - the compute rate: the agents' FLOPs per unit x the units its device seconds buy at
     the price the metered scheduler planned the round with (the last round's median
     seconds per unit over all agents; ``plan_units``) / the seconds of its
     forward+backward and optimizer ops (the optimizer folded into the rate, as
     calibrate does). The simulator hands a rank share x units; the metered real run
     hands it share x units x that median in seconds, and a rank computing alone at the
     round's end, on cheaper steps than the median, spends them on more steps. Counted
     by the steps it ran, the unit came out at the cheap step and the prediction 5-9%
     low. Calibrate takes each rank's own FLOPs over its own time and keeps
     the slowest rank's rate; where ranks share cores, a
     rank computing while the others wait at the gather runs faster per step than one
     computing beside them, so the rate is taken where the round's time is decided;
   - the host overhead per Compute op: the seconds between its ops (the program's own
     Python and the interpreter's bookkeeping, which no span covers) per op
     (calibrate times an empty op with no spans kept);
   - the round all-gather as its last arriver sees it. The simulator completes a
     collective on every member at once; on this host the members finish it up to
     tens of ms apart (most likely as the first ones go back to computing and hold the
     cores the others' gloo threads need), and the round goes on when its last arriver
     has it.
     Calibrate's in-run time is the smallest issue-to-completion over ranks, the first
     to finish. The fabric's time terms are scaled (as calibrate scales them) so that
     the simulator's round all-gather takes what the last arriver measured.
4. The real gloo run, then the simulator on the identical scenario with that profile.

Steps 3-4 are repeated (``--repeats``, default 3): on a host shared with other work the
same program's critical rank computed 42-71 ms a round from one launch to the next, so
the summary takes medians over the repeats and prints each one.

Round time: the mean over rounds 2.. (round 1 includes start-up and warm-up on gloo).
The op table (oresearcher/reporting/round_ops.py) splits it on each round's critical rank. Device
time: on a CPU rank the CPU time of the agent's steps (the device is the core;
oresearcher/programs/cooperative_hosted.py, SliceClock), beside the slices' wall time
and the steady time (median step x steps); and the CPU time of one step in a process
alone against four at once (what sharing the cores does to the same work). The
scheduler meters that device time (oresearcher/cooperation/scheduler.py, ``settle``):
from round 2 it hands out seconds, so the units each agent runs move away from its
shares by what its steps really cost (printed), and the seconds the credit clamp
forgave or forfeited after round 1 are printed beside it (0 unless a burst exceeded a
round's target).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import alloc_ops  # noqa: E402  (cpu_per_step, contention)
from oresearcher.reporting import round_ops  # noqa: E402
from bench_sim_to_real import cpu_ticks, host_stolen, spread  # noqa: E402  (run spread; stolen CPU time)
from oresearcher.programs.cooperative_hosted import device_time_vs_shares  # noqa: E402
from oresearcher.errors import UserError  # noqa: E402
from oresearcher.scenario import load_scenario  # noqa: E402

SCENARIO = REPO / "scenarios" / "alloc-8on4.yaml"


def host_link_GBps(sets) -> tuple:
    """One agent's state copied out to host buffers and back, median of 50 (GB/s one way,
    calibrate's own measurement); and the learner (its FLOPs per step)."""
    from oresearcher.backends.calibration.measure import measure_host_link
    from oresearcher.tasks import make_learner

    sc = load_scenario(SCENARIO, sets)
    return measure_host_link(sc, 0, "cpu") / 1e9, make_learner(sc, 0, mode="real", device="cpu")


def round_time(report) -> float:
    t = [m["time_s"] for m in report["metrics"]["0"]]
    return (t[-1] - t[0]) / (len(t) - 1)


def run(cmd: list, what: str) -> None:
    p = subprocess.run([sys.executable, *cmd], cwd=REPO, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{what} failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")


def calibration_run(tmp: Path, flags: list, unit_flops: float) -> tuple[float, float, float]:
    """(compute FLOP/s, host overhead s per Compute op, round all-gather s) on the
    critical rank of a separate launch of the same scenario, rounds 2.."""
    out = tmp / "calib"
    run(["-m", "oresearcher.run", "--backend=gloo", "--scenario", str(SCENARIO), "--out", str(out),
         "--no-tensorboard", *flags], "calibration run")
    rows = round_ops.critical_rounds(out)
    rate = unit_flops * sum(round_ops.plan_units(r) for r in rows) / sum(r["steps"] for r in rows)
    host = sum(r[round_ops.BETWEEN] for r in rows) / sum(r["compute_ops"] for r in rows)
    return rate, host, statistics.fmean(r[round_ops.GATHER_ROW] for r in rows)


def repeat(tmp: Path, docs: list, flags: list, unit_flops: float) -> dict:
    """One calibration run, the prediction it gives, and the measured run."""
    tmp.mkdir(parents=True, exist_ok=True)
    prof = tmp / "profile.yaml"
    rate, host, want = calibration_run(tmp, flags, unit_flops)
    docs = [dict(d) for d in docs]
    docs[0].update(host_overhead_us=host * 1e6, peak_flops={d: rate for d in docs[0]["peak_flops"]})
    prof.write_text(yaml.safe_dump_all(docs))
    sim_flags = ["--set", f"cluster.profile_files=[{prof}]", "--set", "cluster.device=cpu-calibrated",
                 "--set", "cluster.intra_node=gloo-calibrated", *flags]
    run(["-m", "oresearcher.sim", str(SCENARIO), "--out", str(tmp / "sim0"), *sim_flags], "simulator (idle fit)")
    had = statistics.fmean(r[round_ops.GATHER_ROW] for r in round_ops.critical_rounds(tmp / "sim0", host_s=host))
    for key in ("base_latency_us", "hop_latency_us", "call_overhead_us"):
        docs[1][key] *= want / had
    docs[1]["bandwidth_GBps"] /= want / had
    prof.write_text(yaml.safe_dump_all(docs))
    run(["-m", "oresearcher.run", "--backend=gloo", "--scenario", str(SCENARIO), "--out", str(tmp / "gloo"),
         "--no-tensorboard", *flags], "gloo run")
    run(["-m", "oresearcher.sim", str(SCENARIO), "--out", str(tmp / "sim"), *sim_flags], "simulator")
    real = json.loads((tmp / "gloo" / "report.json").read_text())
    sim = json.loads((tmp / "sim" / "report.json").read_text())
    return {"rate": rate, "host": host, "gather": want, "idle_gather": had, "real": real, "sim": sim,
            "pred": round_time(sim), "meas": round_time(real),
            "pred_ops": round_ops.mean_ms(round_ops.critical_rounds(tmp / "sim", host_s=host)),
            "meas_ops": round_ops.mean_ms(round_ops.critical_rounds(tmp / "gloo"))}


def units_vs_shares(report, skip_rounds: int = 1) -> list:
    """Per agent: its fraction of the units run over its fraction of the shares, less 1
    (rounds after ``skip_rounds``)."""
    m = report["metrics"]["0"][skip_rounds:]
    n = sum(1 for key in m[0] if key.startswith("share."))
    units = [sum(x[f"units.{a}"] for x in m) for a in range(n)]
    shares = [sum(x[f"share.{a}"] for x in m) for a in range(n)]
    return [(u / sum(units)) / (s / sum(shares)) - 1 for u, s in zip(units, shares)]


def clamped_ms(report) -> list:
    """Per agent: ms the credit clamp dropped after round 1 (round 1's own deviation is
    dropped by design: it was planned in units)."""
    m = report["metrics"]["0"]
    n = sum(1 for key in m[0] if key.startswith("dropped."))
    return [1e3 * (m[-1][f"dropped.{a}"] - m[0][f"dropped.{a}"]) for a in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], help="scenario override FIELD=VALUE (repeatable)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="calibration run + measured run pairs (default 3); the summary takes medians")
    ap.add_argument("--keep", metavar="DIR", help="keep profiles, runs and reports in DIR")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print("bench_allocation: --repeats must be at least 1", file=sys.stderr)
        return 2
    sets = args.set
    flags = [x for s in sets for x in ("--set", s)]
    try:
        sc = load_scenario(SCENARIO, sets)
    except (UserError, ValueError) as e:
        print(f"bench_allocation: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    load0, t0, ticks0 = os.getloadavg(), time.perf_counter(), cpu_ticks()
    reps = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.keep or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        prof = tmp / "calibrate.yaml"
        run(["-m", "oresearcher.calibrate", "--backend=gloo", "--scenario", str(SCENARIO), "--out", str(prof),
             "--no-jitter", "--no-in-run", *flags], "calibrate")
        docs = list(yaml.safe_load_all(prof.read_text()))
        link, learner = host_link_GBps(sets)
        rate_cal, host_cal = docs[0]["peak_flops"]["fp32"], docs[0]["host_overhead_us"] * 1e-6
        docs[0]["host_link_GBps"] = link
        for i in range(args.repeats):
            reps.append(repeat(tmp / f"repeat{i + 1}", docs, flags, learner.fwd_flops + learner.bwd_flops))
    med = lambda key: statistics.median(r[key] for r in reps)  # noqa: E731
    print(f"load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after ({os.cpu_count()} cores); "
          f"{time.perf_counter() - t0:.0f} s{host_stolen(ticks0)}")
    print(f"model inputs: host link {link:.2f} GB/s (measured here); calibrate: compute {rate_cal / 1e9:.3f} "
          f"GFLOP/s, host overhead {host_cal * 1e6:.1f} us per op; from each calibration run's critical rank:")
    for i, r in enumerate(reps, 1):
        print(f"  repeat {i}: compute {r['rate'] / 1e9:.3f} GFLOP/s, host overhead {r['host'] * 1e6:.1f} us per "
              f"Compute op, round all-gather {r['gather'] * 1e3:.1f} ms (idle fit {r['idle_gather'] * 1e3:.1f}); "
              f"round time predicted {r['pred'] * 1e3:.1f} ms, measured {r['meas'] * 1e3:.1f} ms, "
              f"{(r['pred'] - r['meas']) / r['meas']:+.1%}")
    pr, me = med("pred"), med("meas")
    print(f"round time (median of {len(reps)}): predicted {pr * 1e3:.1f} ms, measured {me * 1e3:.1f} ms, "
          f"error {(pr - me) / me:+.1%}; run spread {spread([r['meas'] for r in reps]):.0%} "
          "((max - min) / median of the real runs: an error inside it is the host's own noise)")
    rows = list(reps[0]["pred_ops"])
    print("\n".join(round_ops.table_lines({k: statistics.median(r["pred_ops"][k] for r in reps) for k in rows},
                                           {k: statistics.median(r["meas_ops"][k] for r in reps) for k in rows})))
    print(f"device time / shares per agent (relative error of each agent's fraction against its run's own "
          f"shares, rounds 2.., errors averaged over the {len(reps)} runs; metered real runs take different "
          "steps, so their losses and shares differ from run to run):")
    for label, key, kw in (("sim", "sim", {"skip_rounds": 0}), ("gloo CPU time (device time)", "real", {}),
                           ("gloo wall time of the slices", "real", {"key": "wall_s"}),
                           ("gloo steady (median step)", "real", {"key": "steady_s"})):
        got = [device_time_vs_shares(r[key], **kw)[:2] for r in reps]
        errs = [statistics.fmean((u[a] - g[a]) / g[a] for u, g in got) for a in range(len(got[0][0]))]
        each = " ".join(f"{max(abs(u - g) / g for u, g in zip(*x)):.1%}" for x in got)
        print(f"  {label:29s} max |error| {max(abs(e) for e in errs):6.1%}  " + " ".join(f"{e:+.1%}" for e in errs)
              + (f"  (each run: {each})" if len(reps) > 1 else ""))
    given = device_time_vs_shares(reps[0]["sim"], skip_rounds=0)[1]
    print("shares over the run (the simulator's):", " ".join(f"{g:.3f}" for g in given))
    moved = [units_vs_shares(r["real"]) for r in reps]
    print("gloo units run / shares - 1 (metering moves steps to match seconds), averaged over the runs:",
          " ".join(f"{statistics.fmean(x[a] for x in moved):+.1%}" for a in range(len(moved[0]))))
    drop = [clamped_ms(r["real"]) for r in reps]
    print("credit clamp after round 1, ms per agent (each run):",
          "; ".join(" ".join(f"{d:+.2f}" for d in x) for x in drop))
    alone, shared = alloc_ops.contention(sc.world_size)
    print(f"CPU time of one agent step (median): {alone * 1e3:.3f} ms in a process alone, "
          f"{statistics.fmean(shared) * 1e3:.3f} ms with {sc.world_size} at once\n"
          f"  ({statistics.fmean(shared) / alone - 1:+.0%}: the same work costs more CPU time on shared cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
