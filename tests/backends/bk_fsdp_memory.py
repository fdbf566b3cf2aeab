"""Run inside a launched rank: the peak tensor memory of an fsdp learner's life (built,
then 3 steps) for each reshard setting, saved by rank 0 to OUT as JSON.

    python tests/backends/bk_fsdp_memory.py SCENARIO OUT [FIELD=VALUE ...]
"""
from __future__ import annotations

import gc
import json
import sys

import torch.distributed as dist

from oresearcher.backends.fsdp.learner import make_learner
from oresearcher.backends.run.launcher import from_environ
from oresearcher.backends.calibration.memory_probe import PeakMemory
from oresearcher.backends.run.worker import finish_rank, init_process_group
from oresearcher.scenario import load_scenario

STEPS = 3


def main(scenario_path: str, out: str, *overrides: str) -> None:
    denv = from_environ()
    device, _ = init_process_group(denv, "gloo", 60.0)
    peaks = {}
    for reshard in ("true", "false"):
        scenario = load_scenario(scenario_path, [f"agents.count={denv.world_size}",
                                                 f"fsdp.reshard_after_forward={reshard}", *overrides])
        dist.barrier()
        with PeakMemory() as mem:
            learner = make_learner(scenario, denv.rank, denv.world_size, device)
            for _ in range(STEPS):
                learner.forward_backward()
                learner.optimizer_step()
            dist.barrier()
        del learner
        gc.collect()
        peaks[reshard] = mem.peak_bytes
    write_gathered(peaks, out, denv)


def write_gathered(mine, out, denv) -> None:
    """Every rank's ``mine`` in rank order, written as JSON by rank 0; then the group ends."""
    held = [None] * denv.world_size
    dist.all_gather_object(held, mine)
    if denv.rank == 0:
        with open(out, "w") as f:
            json.dump(held, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
    finish_rank(0)  # skips gloo's static destructors (see backends.run.worker.finish_rank)
