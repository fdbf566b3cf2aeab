"""Simulated memory per rank of fsdp (sim/memory.py, estimate_fsdp_memory) beside the
peak measured on gloo ranks (the profiler's allocation events, backends/calibration/memory_probe.py),
for ZeRO-3 and ZeRO-2, at 2 and 4 ranks.

    OMP_NUM_THREADS=1 python benchmarks/bench_fsdp_memory.py
    OMP_NUM_THREADS=1 python benchmarks/bench_fsdp_memory.py --scenario scenarios/cpu-fsdp.yaml --ranks 2 4

Each rank measures its learner's whole life (model built, sharded, 3 steps), so the
figure holds everything the prediction sums: sharded states, gathered blocks, gradient
buffers, activations (and whatever else the rank allocated).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from oresearcher.backends.run.launcher import launch_local
from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import build_cluster, memory_report

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "backends" / "bk_fsdp_memory.py"


def measure(scenario: str, world: int) -> list[dict]:
    """Per-rank peaks {"true": bytes, "false": bytes} (reshard_after_forward)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peaks.json"
        res = launch_local([sys.executable, str(WORKER), scenario, str(out)], world, timeout_s=120, env=env)
        if not res.ok:
            raise SystemExit(f"ranks failed: {res.failure}")
        return json.loads(out.read_text())


def predicted(scenario: str, world: int, reshard: str) -> int:
    sc = load_scenario(scenario, [f"agents.count={world}", f"fsdp.reshard_after_forward={reshard}"])
    return memory_report(sc, build_cluster(sc)[0])["total"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default=str(REPO / "scenarios" / "cpu-fsdp.yaml"))
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    print(f"{'setting':8} {'ranks':>5} {'predicted':>10} {'measured (median, min-max)':>30} {'error':>7} {'worst':>7}")
    for world in args.ranks:
        held = measure(args.scenario, world)
        for reshard, label in (("true", "ZeRO-3"), ("false", "ZeRO-2")):
            pred, got = predicted(args.scenario, world, reshard), [h[reshard] for h in held]
            med = statistics.median(got)
            worst = max((pred / g - 1 for g in got), key=abs)
            spread = f"({min(got) / 1e6:.2f}-{max(got) / 1e6:.2f})"
            print(f"{label:8} {world:5d} {pred / 1e6:8.2f} MB {med / 1e6:10.2f} MB {spread} "
                  f"{pred / med - 1:+7.1%} {worst:+7.1%}")


if __name__ == "__main__":
    main()
