"""Hosted agents (cooperation.allocation.agents_per_device): the simulator's predicted
round time beside a real gloo run, op by op, and each agent's device time beside its shares.

    OMP_NUM_THREADS=1 python benchmarks/bench_allocation.py      # about a minute

As the predict-then-measure chain (benchmarks/bench_sim_to_real.py), nothing of the run
being predicted feeds the prediction:

1. ``python -m oresearcher.calibrate --backend=gloo`` on the same scenario (its own
   launch) runs the same hosted program for the same rounds (``--compute-steps``: a
   hosted "step" is a round; its first two are warm-up), so its compute rate and its
   in-run collective factor come from the load a hosted round puts on this host: the
   ranks whose agents hold few shares wait at the gather while the others compute.
   Calibrate divides rank 0's FLOPs per round by the slowest rank's compute per round;
   under allocation the ranks run different work, so the rate is taken here as the
   slowest rank's own FLOPs (from the schedule, which the simulator reproduces exactly)
   over its time (the profile's comment lists each rank's).
2. The host link a switch crosses: one agent's state copied out and back
   (``host_link_GBps``, which calibrate does not write).
3. The Python between ops (the program's own code and the interpreter's bookkeeping,
   which no span covers): a one-rank run of the same program on a core of its own gives
   the seconds between ops per Compute op; scaled by how much slower the calibrated
   ranks computed than that lone rank (same program, per unit of work), it is the
   profile's ``host_overhead_us`` (calibrate measures an empty op with no spans kept).
4. The round's all-gather as the critical rank sees it. The simulator completes a
   collective on every member at once; on this host the members finish it up to tens
   of ms apart (the first ones go back to computing and hold the cores the others'
   gloo threads need), and the round goes on when its last arriver has it. Calibrate
   times an in-run collective as the smallest issue-to-completion over ranks, which is
   the first to finish, not the last arriver. So a calibration run (its own launch of
   the same scenario) gives the last arriver's all-gather time per round; the fabric's
   time terms are scaled (as calibrate scales them) so that the simulator's round
   all-gather takes that long.
5. The real gloo run, then the simulator on the identical scenario with that profile.

Round time: the mean over rounds 2.. (round 1 includes start-up and warm-up on gloo).
The op table (benchmarks/alloc_ops.py) splits it on each round's critical rank (the
last to reach the stats all-gather). Device time: on a CPU rank the CPU time of the
agent's steps (the device is the core; oresearcher/programs/cooperative_hosted.py,
SliceClock), beside the slices' wall time and the steady time (median step x steps).
"""
from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import alloc_ops  # noqa: E402
from oresearcher.programs.cooperative_hosted import device_time_vs_shares, move_in, move_out, state_bytes  # noqa: E402
from oresearcher.scenario import load_scenario  # noqa: E402

SCENARIO = REPO / "scenarios" / "alloc-8on4.yaml"


def host_link_GBps(sets) -> tuple:
    """One agent's state copied out to host buffers and back, median of 50 (GB/s one way);
    and the learner (its FLOPs per step)."""
    from oresearcher.tasks import make_learner

    sc = load_scenario(SCENARIO, sets)
    learner = make_learner(sc, 0, mode="real", device="cpu")
    learner.forward_backward()
    learner.optimizer_step()
    ts = []
    for _ in range(50):
        t = time.perf_counter()
        move_in(learner, move_out(learner))
        ts.append(time.perf_counter() - t)
    return 2 * state_bytes(learner, sc.workload.optimizer) / statistics.median(ts) / 1e9, learner


def round_time(report) -> float:
    t = [m["time_s"] for m in report["metrics"]["0"]]
    return (t[-1] - t[0]) / (len(t) - 1)


def run(cmd: list, what: str) -> None:
    p = subprocess.run([sys.executable, *cmd], cwd=REPO, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{what} failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")


def rank_units(report: dict, k: int, skip: int) -> list[float]:
    """Units each rank computed per round (mean over rounds ``skip``..), from the schedule."""
    rows = report["metrics"]["0"][skip:]
    n = sum(1 for key in rows[0] if key.startswith("units."))
    return [statistics.fmean(sum(m[f"units.{a}"] for a in range(r * k, r * k + k)) for m in rows)
            for r in range(n // k)]


COMMENT = re.compile(r"declares ([0-9.e+-]+) FLOP per step in ([0-9.]+) Compute ops, measured [0-9.]+ ms on the "
                     r"slowest rank \(all ranks at once, \w+; per rank: ([0-9., ]+) ms")


def slowest_rank_rate(profile_text: str, units: list, unit_flops: float, k: int, host_s: float) -> tuple:
    """(FLOP/s of the slowest calibrated rank on its own FLOPs, that rank, its seconds per
    unit). ``units``: each rank's units per calibrated round (the same schedule)."""
    m = COMMENT.search(profile_text)
    if m is None:
        sys.exit("calibrate's profile comment has no per-rank compute times (format changed?)")
    per_rank = [float(x) / 1e3 for x in m.group(3).split(",")]
    r0_flops, r0_ops = float(m.group(1)), float(m.group(2))
    extra = r0_flops - units[0] * unit_flops  # fusion: the same on every rank
    slow = max(range(len(per_rank)), key=per_rank.__getitem__)
    flops = units[slow] * unit_flops + extra
    ops = r0_ops + 2 * (units[slow] - units[0])  # a unit is two Compute ops (steps, optimizer)
    return flops / (per_rank[slow] - ops * host_s), slow, per_rank[slow] / units[slow]


def lone_rank(tmp: Path, flags: list) -> tuple[float, float]:
    """One rank, two agents, a core of its own: (seconds between ops per Compute op,
    Compute seconds per unit), rounds 2.."""
    out = tmp / "lone"
    run(["-m", "oresearcher.run", "--backend=gloo", "--scenario", str(SCENARIO), "--out", str(out),
         "--no-tensorboard", "--set", "agents.count=1", "--set", "cluster.gpus_per_node=1", *flags], "one-rank run")
    rows = alloc_ops.critical_rounds(out)
    report = json.loads((out / "report.json").read_text())
    units = statistics.fmean(sum(v for key, v in m.items() if key.startswith("units.")) for m in report["metrics"]["0"][1:])
    gap = sum(r[alloc_ops.BETWEEN] for r in rows) / sum(r["compute_ops"] for r in rows)
    compute = statistics.fmean(r["compute"] for r in rows) / units
    return gap, compute


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], help="scenario override FIELD=VALUE (repeatable)")
    ap.add_argument("--keep", metavar="DIR", help="keep profiles, runs and reports in DIR")
    args = ap.parse_args(argv)
    sets = args.set
    flags = [x for s in sets for x in ("--set", s)]
    sc = load_scenario(SCENARIO, sets)
    k = sc.cooperation.allocation.agents_per_device
    load0, t0 = os.getloadavg(), time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.keep or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        prof = tmp / "profile.yaml"
        run(["-m", "oresearcher.calibrate", "--backend=gloo", "--scenario", str(SCENARIO), "--out", str(prof),
             "--no-jitter", "--compute-steps", str(sc.training.steps - 2), *flags], "calibrate")
        text = prof.read_text()
        docs = list(yaml.safe_load_all(text))
        link, learner = host_link_GBps(sets)
        sim_flags = ["--set", f"cluster.profile_files=[{prof}]", "--set", "cluster.device=cpu-calibrated",
                     "--set", "cluster.intra_node=gloo-calibrated", *flags]
        docs[0]["host_link_GBps"] = link
        prof.write_text(yaml.safe_dump_all(docs))
        run(["-m", "oresearcher.sim", str(SCENARIO), "--out", str(tmp / "sim0"), *sim_flags], "schedule (simulator)")
        units = rank_units(json.loads((tmp / "sim0" / "report.json").read_text()), k, skip=2)
        host_cal = docs[0]["host_overhead_us"] * 1e-6
        rate_cal = docs[0]["peak_flops"]["fp32"]
        rate, slow, per_unit = slowest_rank_rate(text, units, learner.fwd_flops + learner.bwd_flops, k, host_cal)
        gap, lone_unit = lone_rank(tmp, flags)
        host = gap * per_unit / lone_unit
        docs[0]["peak_flops"] = {d: rate for d in docs[0]["peak_flops"]}
        docs[0]["host_overhead_us"] = host * 1e6
        run(["-m", "oresearcher.run", "--backend=gloo", "--scenario", str(SCENARIO), "--out", str(tmp / "calib"),
             "--no-tensorboard", *flags], "calibration run")
        row = "round all-gather (the last to arrive)"
        want = alloc_ops.mean_ms(alloc_ops.critical_rounds(tmp / "calib"))[row]
        had = alloc_ops.mean_ms(alloc_ops.critical_rounds(tmp / "sim0", host_s=host_cal))[row]
        gather = want / had
        for key in ("base_latency_us", "hop_latency_us", "call_overhead_us"):
            docs[1][key] *= gather
        docs[1]["bandwidth_GBps"] /= gather
        prof.write_text(yaml.safe_dump_all(docs))
        run(["-m", "oresearcher.run", "--backend=gloo", "--scenario", str(SCENARIO), "--out", str(tmp / "gloo"),
             "--no-tensorboard", *flags], "gloo run")
        run(["-m", "oresearcher.sim", str(SCENARIO), "--out", str(tmp / "sim"), *sim_flags], "simulator")
        real = json.loads((tmp / "gloo" / "report.json").read_text())
        sim = json.loads((tmp / "sim" / "report.json").read_text())
        pred_ops = alloc_ops.mean_ms(alloc_ops.critical_rounds(tmp / "sim", host_s=host))
        meas_ops = alloc_ops.mean_ms(alloc_ops.critical_rounds(tmp / "gloo"))
        inrun = re.search(r"in-run collectives: ([0-9.]+) x", text)
    pr, me = round_time(sim), round_time(real)
    print(f"load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after ({os.cpu_count()} cores); "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"model inputs: host link {link:.2f} GB/s (measured here); compute {rate / 1e9:.3f} GFLOP/s per rank "
          f"(rank {slow}'s own FLOPs; calibrate wrote {rate_cal / 1e9:.3f} from rank 0's); between ops "
          f"{host * 1e6:.1f} us per Compute op ({gap * 1e6:.1f} us on a lone rank x {per_unit / lone_unit:.2f}, "
          f"the calibrated ranks' slowdown; calibrate wrote {host_cal * 1e6:.1f}); round all-gather "
          f"{want:.1f} ms for its last arriver in the calibration run (calibrate's in-run fit "
          f"{float(inrun.group(1)) if inrun else 1.0:.2f} x the idle sweep gave {had:.1f} ms)")
    print(f"round time: predicted {pr * 1e3:.1f} ms, measured {me * 1e3:.1f} ms, error {(pr - me) / me:+.1%}")
    alloc_ops.print_table(pred_ops, meas_ops)
    print("device time / shares per agent (relative error of each agent's fraction, rounds 2..):")
    for label, rep, kw in (("sim", sim, {"skip_rounds": 0}),
                           ("gloo CPU time (device time)", real, {}),
                           ("gloo wall time of the slices", real, {"key": "wall_s"}),
                           ("gloo steady (median step)", real, {"key": "steady_s"})):
        used, given, _ = device_time_vs_shares(rep, **kw)
        errs = [(u - g) / g for u, g in zip(used, given)]
        print(f"  {label:29s} max |error| {max(abs(e) for e in errs):6.1%}  " + " ".join(f"{e:+.1%}" for e in errs))
    given = device_time_vs_shares(sim, skip_rounds=0)[1]
    print("shares over the run:", " ".join(f"{g:.3f}" for g in given))
    alone, shared = alloc_ops.contention(sc.world_size)
    print(f"CPU time of one agent step (median): {alone * 1e3:.3f} ms in a process alone, "
          f"{statistics.fmean(shared) * 1e3:.3f} ms with {sc.world_size} processes at once "
          f"({statistics.fmean(shared) / alone - 1:+.0%}: the same work costs more CPU time on shared cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
