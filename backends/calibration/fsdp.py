"""Measurements for the fsdp schedule's host costs (oresearcher/programs/fsdp_costs.py),
taken by ``oresearcher.calibrate`` on every rank at once (ranks share cores as in a run).

- Copy bandwidth: ``dst.copy_(src)`` of one transformer block's bytes in the workload's
  dtype (the size FSDP2's copy-out moves per all-gather), read + write bytes per second,
  over distinct buffers spanning 64 MB so that each copy starts cold, as FSDP2's do
  between a block's computes; with more ranks than cores the ranks' copies take turns,
  as in the run.
- DTensor dispatch: the scenario's optimizer steps (and zeroes the gradients of) the
  rank's shards of the model's parameters, once as DTensors (a 1-D mesh over the ranks,
  ``Shard(0)``, as FSDP2 holds them; elementwise ops move no data) and once as plain
  tensors of the same local shapes; the difference per parameter is the host cost FSDP2's
  sharded optimizer step adds (DTensor's Python dispatch of each elementwise op), and the
  plain step per local element is the step's own work.
- FSDP2's bookkeeping per parameter per collective: :mod:`.fsdp_hooks`.

Both are medians over repetitions on this rank; the caller takes the median over ranks.
"""
from __future__ import annotations

import math

import torch

from .fsdp_hooks import bookkeeping
from .device_rates import COLD_BYTES, _median_s


def copy_bandwidth(nbytes: int, repeats: int = 9, device="cpu", span: int = COLD_BYTES) -> float:
    """Read + write bytes/s of copies of ``nbytes`` (fp32 elements) on ``device``, cycling
    through distinct buffers that span ``span`` bytes, so that each copy finds its
    operands out of cache, as FSDP2's copies do after a block's compute has passed
    through the caches."""
    numel = max(1, nbytes // 4)
    pairs = [(torch.ones(numel, device=device), torch.empty(numel, device=device))
             for _ in range(max(1, math.ceil(span / (8 * numel))))]

    def all_pairs():
        for src, dst in pairs:
            dst.copy_(src)
    return 2.0 * 4 * numel * len(pairs) / max(_median_s(all_pairs, repeats, device), 1e-9)


def _local_shapes(shapes, n: int) -> list[tuple[int, ...]]:
    """This rank's shard of each parameter: dim 0 split over ``n`` (padded, as FSDP2 does)."""
    return [((math.ceil(s[0] / n),) + tuple(s[1:])) if s else () for s in shapes]


def _params(shapes, mesh):
    from torch.distributed.tensor import DTensor, Shard

    out = []
    for s in shapes:
        def make():
            t = torch.randn(s) * 0.01
            return t if mesh is None else DTensor.from_local(t, mesh, [Shard(0)], run_check=False)
        p = torch.nn.Parameter(make())
        p.grad = make()
        out.append(p)
    return out


def _optimizer(name: str, params):
    return torch.optim.AdamW(params, lr=1e-3) if name == "adamw" else torch.optim.SGD(params, lr=1e-3)


def optimizer_steps(shapes, world: int, optimizer: str, repeats: int = 15) -> tuple[float, float]:
    """(seconds one parameter's optimizer step and zero_grad add as a DTensor shard over a
    plain tensor of the same shape, seconds per local element of the plain step), over
    this rank's shards of ``shapes`` (the model's parameter shapes; needs the default
    process group: the mesh spans it)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    local = _local_shapes(shapes, world)
    times = {}
    for key, m in (("plain", None), ("dtensor", mesh)):
        opt = _optimizer(optimizer, _params(local, m))

        def step():
            opt.step()
            opt.zero_grad(set_to_none=False)
        step()  # the optimizer's state is created on the first step
        times[key] = _median_s(step, repeats, "cpu")
    elements = sum(math.prod(s) for s in local)
    return max(0.0, times["dtensor"] - times["plain"]) / max(1, len(local)), times["plain"] / max(1, elements)


def measure_fsdp_costs(scenario, world: int, device) -> dict | None:
    """{copy_Bps, dtensor_param_step_s, optimizer_element_s, gather_param_s, reduce_param_s,
    unit_step_s} for a language-model scenario on CPU (None otherwise)."""
    if not scenario.task.language_model or torch.device(device).type != "cpu":
        return None  # GPUs: the profile's datasheet bandwidth; DTensor dispatch overlaps the device
    from oresearcher.models.sharding import scenario_plan

    plan = scenario_plan(scenario)
    block = plan.blocks[0] if plan.blocks else plan.root
    item = torch.empty((), dtype={"fp32": torch.float32, "bf16": torch.bfloat16,
                                  "fp16": torch.float16}[scenario.workload.dtype]).element_size()
    shapes = [s for u in plan.units for s in u.shapes]
    dispatch, element = optimizer_steps(shapes, world, scenario.workload.optimizer)
    gather, reduce, hooks = bookkeeping(len(plan.root.shapes), [len(b.shapes) for b in plan.blocks], world)
    return {"copy_Bps": copy_bandwidth(block.numel * item, device=device), "dtensor_param_step_s": dispatch,
            "optimizer_element_s": element, "gather_param_s": gather, "reduce_param_s": reduce,
            "unit_step_s": hooks}
