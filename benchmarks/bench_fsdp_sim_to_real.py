"""Sim-to-real for sharded training: the simulator's fsdp step, with a profile calibrated
on this machine, beside real gloo runs of ``scenarios/cpu-fsdp.yaml`` (torch's FSDP2).

    OMP_NUM_THREADS=1 python benchmarks/bench_fsdp_sim_to_real.py                 # 2 and 4 ranks, 3 repeats
    OMP_NUM_THREADS=1 python benchmarks/bench_fsdp_sim_to_real.py --ranks 2 --repeats 1 --markdown

The predict-then-measure chain of ``bench_sim_to_real.py``, per world size and repeat:
``python -m oresearcher.calibrate`` on the scenario itself (its own launch, every rank
busy), right away the real run (``python -m oresearcher.run --backend=gloo``), then the
simulator on the identical scenario pointed at that profile. On an fsdp scenario
calibrate times the program's own step by pieces (``backends/calibration/fsdp_inrun.py``):
FSDP2's collectives (the in-run factor is fitted to them), its copies, the optimizer and
the passes, and scales the microbenchmarks' constants to that step.
``--calibrate-with ddp`` calibrates the ddp program of the same model and per-rank batch
instead (the chain before that measurement: the passes' rate from ddp's FLOP ops, the
in-run factor from ddp's gradient buckets, the host costs at the microbenchmarks' level);
``--calibrate-with single`` runs no collective in the program (the idle sweep's fit alone). On gloo the profile says ``streams: false`` (FSDP2
waits for every all-gather and reduce-scatter on CPU ranks) and ``reduce_scatter:
all_reduce`` (gloo all-reduces the whole input): oresearcher/hardware/__init__.py. Medians over repeats;
"run spread" is (max - min) / median of the real runs. Exit 1 if any step-time error is
past 15 %. The measured step is the steady one, over the steps after the first two (the
slowest rank's; calibrate skips two as well): the first holds FSDP2's lazy
initialisation and the optimizer's state allocation, about 100 ms once, which the
simulator does not price; each repeat's line prints the run's figure with them too.

Op by op (``--breakdown``, on by default): after each real run the same scenario runs
``tests/backends/bk_fsdp_profile.py``, which times FSDP2's collectives from inside the
ranks (each wrapped as the rank sees it, waiting for peers included); the table puts
them beside the simulator's per-collective time (in flight, waits included); FSDP2's
copies and bookkeeping around its collectives (its all-gather, copy-out and reduce
functions minus the collectives inside) beside the schedule's copy ops
(oresearcher/programs/fsdp_costs.py); the optimizer step beside the sharded step the
schedule charges (DTensor dispatch per parameter, the plain step per element); and the
rest of forward/backward (the passes and FSDP2's hooks) beside the simulated passes (at
the calibrated pass rate) and hooks. "FSDP2 copies" includes FSDP2's per-parameter
bookkeeping inside those functions on both sides.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sim_to_real import (REPO, WARMUP, calibrate, cpu_ticks, err, host_stolen, measure, predict,  # noqa: E402
                               print_table, spread)

from oresearcher.backends.run.launcher import launch_local  # noqa: E402
from oresearcher.files import write_text  # noqa: E402

PROFILER = REPO / "tests" / "backends" / "bk_fsdp_profile.py"
# rows of the op-by-op table: (label, simulated collective name, measured wrapper name)
OPS = (("all-gathers", "fsdp_all_gather", "all_gather_single"),
       ("reduce-scatters", "fsdp_reduce_scatter", "reduce_scatter_single"),
       ("HSDP all-reduces", "hsdp_all_reduce", "all_reduce"))

KEYS = ("step_time_s", "first_steps_step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s",
        "comm_overhead", "peer_wait_time_s")


def scenario_dict(world: int, steps: int, reshard: bool) -> dict:
    data = yaml.safe_load((REPO / "scenarios" / "cpu-fsdp.yaml").read_text())
    data["name"] = f"fsdp-sim2real-{world}"
    data["agents"]["count"] = world
    data["workload"]["global_batch"] = 2 * world  # 2 sequences per rank at every world size
    data["training"].update(steps=steps, checkpoint_every=0)  # no DCP saves inside the timed steps
    data["fsdp"]["reshard_after_forward"] = reshard
    return data


COPIES = ("fsdp_copy_in", "fsdp_copy_out", "fsdp_rs_copy_in", "fsdp_rs_accumulate")
ROWS = (*(o[0] for o in OPS), "FSDP2 copies", "optimizer step", "passes and hooks", "compute (all)")


def schedule_seconds(path: Path, profile: Path) -> dict:
    """Seconds per step the simulator charges rank 0's fsdp Compute ops, by op name (the
    schedule's own ops, walked once; no jitter, no host overhead per op)."""
    from collections import defaultdict
    from types import SimpleNamespace

    from oresearcher.ops import Compute
    from oresearcher.programs.fsdp import Schedule
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.simulate import build_cluster

    sc = load_scenario(path, [f"cluster.profile_files=[{profile}]", "cluster.device=cpu-calibrated",
                              "cluster.intra_node=gloo-calibrated"])
    sched = Schedule.build(SimpleNamespace(scenario=sc, rank=0, world_size=sc.world_size, profile=build_cluster(sc)[0]))
    def one_step():
        yield from sched.step()
        yield from sched.optimizer_dispatch()
    out, gen, val = defaultdict(float), one_step(), None
    while True:
        try:
            op = gen.send(val)
        except StopIteration:
            return out
        val = None
        if isinstance(op, Compute):
            out[op.name] += op.flops / sched.costs.rate


def measured_ops(path: Path, out: Path) -> dict:
    """ms per step, mean over ranks, of each collective and of the compute around them."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    res = launch_local([sys.executable, str(PROFILER), str(path), str(out)], int(yaml.safe_load(
        path.read_text())["agents"]["count"]), timeout_s=300, env=env)
    if not res.ok:
        sys.exit(f"profiled run of {path} failed: {res.failure}")
    ranks = json.loads(out.read_text())
    got = {label: statistics.mean(r.get(real, 0.0) for r in ranks) for label, _, real in OPS}
    for label, key in (("FSDP2 copies", "copies"), ("optimizer step", "optimizer"), ("passes and hooks", "compute")):
        got[label] = statistics.mean(r[key] for r in ranks)
    got["compute (all)"] = got["FSDP2 copies"] + got["optimizer step"] + got["passes and hooks"]
    return got


def predicted_ops(report: dict, charged: dict) -> dict:
    """The report's collectives and compute per step, the compute split by the schedule's
    own charges (``charged``: :func:`schedule_seconds`)."""
    per = report["world_size"] * report["steps"]
    by_name = {b["name"]: b["time_s"] for b in report["breakdown"]}
    got = {label: 1e3 * by_name.get(sim, 0.0) / per for label, sim, _ in OPS}
    got["compute (all)"] = 1e3 * report["compute_time_s"]
    got["FSDP2 copies"] = 1e3 * sum(charged.get(k, 0.0) for k in COPIES)
    got["optimizer step"] = 1e3 * charged.get("fsdp_sharded_optimizer", 0.0)
    got["passes and hooks"] = got["compute (all)"] - got["FSDP2 copies"] - got["optimizer step"]
    return got


def print_ops(n: int, pred: list[dict], meas: list[dict]) -> None:
    print(f"\n{n} ranks, ms per step (medians)   predicted   measured   error")
    for label in ROWS:
        p, m = (statistics.median(d[label] for d in ds) for ds in (pred, meas))
        if p or m:
            print(f"  {label:30s} {p:9.1f} {m:10.1f}   {err(p, m):+6.1%}")


def median(reports: list[dict]) -> dict:
    return {k: statistics.median(r.get(k, 0.0) for r in reports) for k in KEYS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default 2 4)")
    ap.add_argument("--repeats", type=int, default=3, help="calibrate+run pairs per world size (default 3)")
    ap.add_argument("--steps", type=int, default=20, help="steps of each real run and prediction (default 20)")
    ap.add_argument("--calibrate-with", default="fsdp", metavar="STRATEGY",
                    help="program calibrate runs (default fsdp, the scenario's own; ddp: the same model's ddp program; "
                         "single: no collectives, so no in-run factor)")
    ap.add_argument("--zero2", action="store_true", help="reshard_after_forward false (ZeRO-2) instead of ZeRO-3")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the op-by-op profiled run")
    ap.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    ap.add_argument("--keep", metavar="DIR", help="write scenarios, profiles and runs to DIR")
    args = ap.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fsdp-sim2real-"))
    work.mkdir(parents=True, exist_ok=True)
    rows, t0, load_before, ticks0 = [], time.perf_counter(), os.getloadavg()[0], cpu_ticks()
    for n in args.ranks:
        path = work / f"fsdp{n}.yaml"
        path.write_text(yaml.safe_dump(scenario_dict(n, args.steps, not args.zero2), sort_keys=False))
        preds, meass, pops, mops = [], [], [], []
        for k in range(args.repeats):
            profile = work / f"profile{n}-{k}.yaml"
            calibrate(path, profile, ["--set", f"training.strategy={args.calibrate_with}"])
            meass.append(measure(path, work / f"run{n}-{k}"))  # steady steps (bench_sim_to_real.steady)
            preds.append(predict(path, profile))
            if not args.no_breakdown:
                mops.append(measured_ops(path, work / f"ops{n}-{k}.json"))
                pops.append(predicted_ops(preds[-1], schedule_seconds(path, profile)))
            print(f"[{time.perf_counter() - t0:5.0f} s] {n} ranks, repeat {k + 1}: step "
                  f"{1e3 * preds[-1]['step_time_s']:.1f} predicted vs {1e3 * meass[-1]['step_time_s']:.1f} ms measured "
                  f"(steps {WARMUP + 1}.., {err(preds[-1]['step_time_s'], meass[-1]['step_time_s']):+.1%}; with the "
                  f"first {WARMUP}: {1e3 * meass[-1]['first_steps_step_time_s']:.1f} ms, "
                  f"{err(preds[-1]['step_time_s'], meass[-1]['first_steps_step_time_s']):+.1%})", flush=True)
        if mops:
            print_ops(n, pops, mops)
        pred, meas = median(preds), median(meass)
        rows.append({"config": f"fsdp {'ZeRO-2' if args.zero2 else 'ZeRO-3'}, cpu-fsdp", "ranks": n, "pred": pred,
                     "meas": meas, "step_spread": spread([m["step_time_s"] for m in meass]),
                     "overhead_spread": spread([m["comm_overhead"] for m in meass]),
                     "step_err": err(pred["step_time_s"], meas["step_time_s"]),
                     "overhead_err": err(pred["comm_overhead"], meas["comm_overhead"])})
    print_table(rows, args.markdown)
    if any(not r["meas"]["comm_overhead"] for r in rows):
        print("(a measured overhead of 0: that run's collectives ran inside its one Compute op, uncounted)")
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} cores; {args.repeats} repeat(s), medians{host_stolen(ticks0)}")
    write_text(work / "fsdp_sim_to_real.json", json.dumps(rows, indent=1, default=float))
    print(f"scenarios, profiles, runs and fsdp_sim_to_real.json in {work}")
    return 0 if all(abs(r["step_err"]) <= 0.15 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
