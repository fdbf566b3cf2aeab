"""Hosted agents (cooperation.allocation.agents_per_device): the simulator's predicted
round time beside a real gloo run, and each agent's device time beside its shares.

    OMP_NUM_THREADS=1 python benchmarks/bench_allocation.py      # about 2 minutes

As the predict-then-measure chain (benchmarks/bench_sim_to_real.py): first
``python -m oresearcher.calibrate --backend=gloo`` on the same scenario writes a device and
fabric profile (its own launch: nothing of the run being predicted feeds the
prediction); the host link a switch crosses is measured here by copying one agent's
state out and back (``host_link_GBps``, which calibrate does not write); then the real
gloo run, then the simulator on the identical scenario pointed at that profile. Round
time: the mean over rounds 2.. (round 1 includes start-up and warm-up on gloo).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from oresearcher.programs.cooperative_hosted import device_time_vs_shares, move_in, move_out, state_bytes  # noqa: E402
from oresearcher.scenario import load_scenario  # noqa: E402

SCENARIO = REPO / "scenarios" / "alloc-8on4.yaml"


def host_link_GBps(sets) -> float:
    """One agent's state copied out to host buffers and back, median of 50 (GB/s one way)."""
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
    return 2 * state_bytes(learner, sc.workload.optimizer) / statistics.median(ts) / 1e9


def round_time(report) -> float:
    t = [m["time_s"] for m in report["metrics"]["0"]]
    return (t[-1] - t[0]) / (len(t) - 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], help="scenario override FIELD=VALUE (repeatable)")
    args = ap.parse_args(argv)
    sets = args.set
    flags = [x for s in sets for x in ("--set", s)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prof = tmp / "profile.yaml"
        subprocess.run([sys.executable, "-m", "oresearcher.calibrate", "--backend=gloo", "--scenario", str(SCENARIO),
                        "--out", str(prof), "--no-jitter", *flags], cwd=REPO, check=True, capture_output=True)
        docs = list(yaml.safe_load_all(prof.read_text()))
        link = host_link_GBps(sets)
        docs[0]["host_link_GBps"] = link
        prof.write_text(yaml.safe_dump_all(docs))
        subprocess.run([sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--scenario", str(SCENARIO),
                        "--out", str(tmp / "gloo"), *flags], cwd=REPO, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "oresearcher.sim", str(SCENARIO), "--out", str(tmp / "sim"),
                        "--set", f"cluster.profile_files=[{prof}]", "--set", "cluster.device=cpu-calibrated",
                        "--set", "cluster.intra_node=gloo-calibrated", *flags], cwd=REPO, check=True,
                       capture_output=True)
        real = json.loads((tmp / "gloo" / "report.json").read_text())
        sim = json.loads((tmp / "sim" / "report.json").read_text())
    pr, me = round_time(sim), round_time(real)
    print(f"host link (measured here): {link:.2f} GB/s; calibrated compute: {docs[0]['peak_flops']['fp32'] / 1e9:.3f} "
          f"GFLOP/s per rank")
    print(f"round time: predicted {pr * 1e3:.1f} ms, measured {me * 1e3:.1f} ms, error {(pr - me) / me:+.1%}")
    print("device time / shares per agent (relative error of each agent's fraction):")
    for label, rep, kw in (("sim", sim, {"skip_rounds": 0}), ("gloo raw", real, {}),
                           ("gloo, stalls capped at 2x", real, {"burst": 2.0}),
                           ("gloo steady (median step)", real, {"key": "steady_s"})):
        used, given, capped = device_time_vs_shares(rep, **kw)
        errs = [(u - g) / g for u, g in zip(used, given)]
        print(f"  {label:27s} max |error| {max(abs(e) for e in errs):6.1%}  "
              + " ".join(f"{e:+.1%}" for e in errs) + (f"  ({capped:.1%} of slices capped)" if capped else ""))
    given = device_time_vs_shares(sim, skip_rounds=0)[1]
    print("shares over the run:", " ".join(f"{g:.3f}" for g in given))
    return 0


if __name__ == "__main__":
    sys.exit(main())
