"""Run inside a launched rank: interpret bk_programs.exercise on torch.distributed and
save this rank's results and timeline figures to OUT/rank-<r>.pt.

    python tests/backends/bk_mp_worker.py OUT   (started by launch_local, one per rank)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from oresearcher.backends.run.interpreter import Interpreter, make_clock
from oresearcher.backends.run.launcher import from_environ
from oresearcher.backends.run.worker import finish_rank, gather_timeline, init_process_group
from oresearcher.reporting.report import Timeline, summarize

import bk_programs


def main(out: Path) -> None:
    denv = from_environ()
    device, _ = init_process_group(denv, "gloo", 30.0)
    rank, world = denv.rank, denv.world_size
    tl = Timeline(world)
    steps = []
    interp = Interpreter(rank, world, device=device, timeline=tl, clock=make_clock(),
                         on_step=lambda s, m, st: steps.append((s, m, st)))
    results = []
    interp.run(bk_programs.exercise(rank, world, results))
    merged = gather_timeline(tl, rank, world)
    report = summarize(merged, {}, "gloo") if rank == 0 else None
    spans = [(s.cat, s.name, s.start, s.end, s.wire_bytes) for s in tl.spans]
    torch.save({"results": results, "spans": spans, "steps": steps, "report": report}, out / f"rank-{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    finish_rank(0)  # skips gloo's static destructors (see backends.run.worker.finish_rank)
