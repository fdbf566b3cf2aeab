"""FSDP2's per-parameter bookkeeping around its collectives, measured for the fsdp
schedule (oresearcher/programs/fsdp_costs.py) by ``oresearcher.calibrate``.

Around every all-gather and reduce-scatter FSDP2 (torch 2.13) runs Python over the unit's
parameters: it collects each shard for the copy-in, resizes and views each unsharded
parameter's storage at the copy-out, and views each reduced shard out and wraps it as a
DTensor gradient. That costs host time per parameter, apart from the bytes copied.

The microbenchmark trains a model with the scenario's units and parameter counts in which
every parameter is one element per rank (so no copy moves a measurable number of bytes),
``fully_shard`` per block and at the root as the fsdp backend does, every rank at once.
It times FSDP2's own all-gather, copy-out and reduce functions as ``_fsdp_param_group``
calls them and takes the collectives inside them off: what remains, over the parameters
those calls handled, is the bookkeeping per parameter per all-gather and per
reduce-scatter. The step's time beyond the same model unsharded and beyond those three
functions is FSDP2's hooks (each unit's pre/post forward and backward, its reshards):
per unit per step.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.distributed as dist


class _Unit(torch.nn.Module):
    def __init__(self, params: int, world: int):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(world)) for _ in range(params)])

    def forward(self, x):
        return x * torch.stack([p.sum() for p in self.ps]).sum()


class _Model(torch.nn.Module):
    def __init__(self, root: int, blocks: list[int], world: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Unit(k, world) for k in blocks)
        self.head = _Unit(root, world)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@contextmanager
def _timed(spent: dict, handled: dict):
    """Time FSDP2's three functions (and count the parameters each call handles) and the
    collectives inside them; the originals come back on exit."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

    saved = []

    def wrap(module, name, key, count: bool):
        inner = getattr(module, name)
        saved.append((module, name, inner))

        def call(*args, **kwargs):
            t = time.perf_counter()
            out = inner(*args, **kwargs)
            spent[key] += time.perf_counter() - t
            if count:
                handled[key] += len(args[0])  # fsdp_params, the first argument of all three
            return out
        setattr(module, name, call)
    for name, key in (("foreach_all_gather", "gather"), ("foreach_all_gather_copy_out", "gather"),
                      ("foreach_reduce", "reduce")):
        wrap(group, name, key, name != "foreach_all_gather_copy_out")
    for name, key in (("all_gather_single", "gather_comm"), ("reduce_scatter_single", "reduce_comm")):
        wrap(dist, name, key, False)
    try:
        yield
    finally:
        for module, name, inner in reversed(saved):
            setattr(module, name, inner)


def _steps(model, steps: int, warmup: int) -> float:
    x = torch.ones(())
    for _ in range(warmup):
        model(x).backward()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        model(x).backward()
    return time.perf_counter() - t


def bookkeeping(root: int, blocks: list[int], world: int, steps: int = 20,
                warmup: int = 3) -> tuple[float, float, float]:
    """(seconds per parameter per all-gather, per parameter per reduce-scatter, per unit
    per step) of FSDP2's bookkeeping on a model of ``root`` parameters and ``blocks``
    (parameters per block), over the default process group. The last is what the sharded
    step takes beyond the same model unsharded and beyond FSDP2's three functions (its
    hooks: pre/post forward and backward of each unit, the reshards), per unit."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    plain = _steps(_Model(root, blocks, world), steps, warmup)
    model = _Model(root, blocks, world)
    for i, b in enumerate(model.blocks):
        fully_shard(b, mesh=mesh, reshard_after_forward=i < len(model.blocks) - 1)
    fully_shard(model, mesh=mesh)
    _steps(model, 0, warmup)
    spent, handled = defaultdict(float), defaultdict(int)
    with _timed(spent, handled):
        total = _steps(model, steps, 0)
    gather = max(0.0, spent["gather"] - spent["gather_comm"]) / max(1, handled["gather"])
    reduce = max(0.0, spent["reduce"] - spent["reduce_comm"]) / max(1, handled["reduce"])
    hooks = max(0.0, total - plain - spent["gather"] - spent["reduce"]) / (steps * (1 + len(blocks)))
    return gather, reduce, hooks
