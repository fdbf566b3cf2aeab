"""Run inside a launched rank: where an fsdp step's time goes on this backend. FSDP2
calls ``torch.distributed.all_gather_single`` / ``reduce_scatter_single`` (and
``all_reduce`` for HSDP) through the module, so wrapping those three times each
collective as the rank sees it (waiting for its peers included). FSDP2's own
all-gather, copy-out and reduce functions are timed too: minus the collectives inside
them, that is FSDP2's copying and bookkeeping around its collectives ("copies"). The rest
of forward/backward is compute and hooks. Rank 0 writes every rank's figures (ms per
step, mean over the timed steps) to OUT as JSON.

    python tests/backends/bk_fsdp_profile.py SCENARIO OUT [FIELD=VALUE ...]
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch.distributed as dist
from torch.distributed.fsdp._fully_shard import _fsdp_param_group

from bk_fsdp_memory import write_gathered
from oresearcher.backends.fsdp.learner import make_learner
from oresearcher.backends.run.launcher import from_environ
from oresearcher.backends.run.worker import finish_rank, init_process_group
from oresearcher.scenario import load_scenario

WARMUP, STEPS = 2, 10
SPENT = defaultdict(float)  # collective name -> seconds inside it on this rank


def timed(name: str, module=dist, key=None):
    inner = getattr(module, name)

    def call(*args, **kwargs):
        t = time.perf_counter()
        work = inner(*args, **kwargs)
        if module is dist and work is not None and kwargs.get("async_op"):
            work.wait()  # FSDP2 on CPU issues them synchronously; kept for a GPU's async ones
        SPENT[key or name] += time.perf_counter() - t
        return work
    setattr(module, name, call)


def time_fsdp_copies() -> None:
    """FSDP2's all-gather (copy-in, then the collective), copy-out and reduce (copy-in, the
    collective, the shard's accumulation), as _fsdp_param_group calls them (torch 2.13):
    each minus the collectives inside is FSDP2's copying and bookkeeping around them."""
    for name in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce"):
        timed(name, _fsdp_param_group, "fsdp_" + name)


def main(scenario_path: str, out: str, *overrides: str) -> None:
    for name in ("all_gather_single", "reduce_scatter_single", "all_reduce"):
        timed(name)
    time_fsdp_copies()
    denv = from_environ()
    device, _ = init_process_group(denv, "gloo", 60.0)
    scenario = load_scenario(scenario_path, [f"agents.count={denv.world_size}", *overrides])
    learner = make_learner(scenario, denv.rank, denv.world_size, device)
    for _ in range(WARMUP):
        learner.forward_backward()
        learner.optimizer_step()
    dist.barrier()
    SPENT.clear()
    fb = opt = 0.0
    for _ in range(STEPS):
        t0 = time.perf_counter()
        learner.forward_backward()
        t1 = time.perf_counter()
        learner.optimizer_step()
        fb, opt = fb + t1 - t0, opt + time.perf_counter() - t1
    comms = sum(v for k, v in SPENT.items() if not k.startswith("fsdp_"))
    copies = sum(v for k, v in SPENT.items() if k.startswith("fsdp_")) - comms
    mine = {"forward_backward": fb, "optimizer": opt, **SPENT, "copies": copies}
    mine = {k: 1e3 * v / STEPS for k, v in mine.items()}
    mine["compute"] = mine["forward_backward"] - 1e3 * (comms + copies) / STEPS
    write_gathered(mine, out, denv)


if __name__ == "__main__":
    main(*sys.argv[1:])
    finish_rank(0)  # skips gloo's static destructors (see backends.run.worker.finish_rank)
