"""Run inside a launched rank: load an fsdp checkpoint (saved by any number of ranks)
into this run's fully_shard model and optimizer, and save it again.

    python tests/backends/bk_fsdp_reshard.py SCENARIO SRC_STEP_DIR DST_STEP_DIR
"""
from __future__ import annotations

import sys

from oresearcher.backends.fsdp.learner import make_learner
from oresearcher.backends.run.launcher import from_environ
from oresearcher.backends.run.worker import finish_rank, init_process_group
from oresearcher.scenario import load_scenario

import torch.distributed as dist


def main(scenario_path: str, src: str, dst: str) -> None:
    denv = from_environ()
    device, _ = init_process_group(denv, "gloo", 60.0)
    scenario = load_scenario(scenario_path, [f"agents.count={denv.world_size}"])
    learner = make_learner(scenario, denv.rank, denv.world_size, device)
    learner.load_sharded(src)
    learner.save_sharded(dst)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    finish_rank(0)  # skips gloo's static destructors (see backends.run.worker.finish_rank)
