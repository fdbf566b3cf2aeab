"""The fsdp program's own step, timed piece by piece with every rank busy, for
``oresearcher.calibrate`` on a scenario with ``training.strategy: fsdp`` (CPU ranks).

calibrate's microbenchmarks (:mod:`.fsdp`, :mod:`.fsdp_hooks`) give
each of the fsdp schedule's host costs its form: bytes over a copy bandwidth, dispatch per
parameter, bookkeeping per parameter per collective, hooks per unit
(``oresearcher/programs/fsdp_costs.py``). Each runs alone in a tight loop. In a real step
the same pieces alternate with the passes and the collectives, and they ran 15-20% slower
than the loops said (2 ranks on this 2-core host, quiet: copies -16%, optimizer -20%,
passes and hooks -15% predicted against measured; ``benchmarks/bench_fsdp_sim_to_real.py``
calibrated with ddp, 2026-12-01). Calibrating with ddp (the earlier chain) also fitted the
fabric's in-run factor to ddp's 1-2 MB gradient buckets, not to FSDP2's per-block
collectives.

So the level of each group is taken from the program's own step, as the fabric's idle fit
is scaled to the program's own collectives (calibrate's in-run factor). The scenario's
fsdp learner (torch's fully_shard per block) runs ``warmup + steps`` steps, each the
program's forward+backward with its divergence check (:func:`sharded_forward_backward`)
and the optimizer step, and this module times, per rank:

- every collective FSDP2 calls (``torch.distributed.all_gather_single``,
  ``reduce_scatter_single``, ``all_reduce``) as the rank sees it, with its kind, the ring
  model's bytes and its group's size: the in-run collectives the fabric's factor is fitted
  to. gloo has no reduce-scatter (it all-reduces the whole input; oresearcher/hardware/__init__.py,
  ``reduce_scatter: all_reduce``), so on gloo one is recorded as that all-reduce;
- FSDP2's all-gather, copy-out and reduce functions (``_fsdp_param_group``, torch 2.13)
  minus the collectives inside them: its copies and its bookkeeping around the collectives;
- the optimizer: its step, and the ``zero_grad`` the learner runs before forward;
- the rest of forward and backward: the passes and FSDP2's hooks.

:mod:`oresearcher.calibration.profiles` divides each group by what the schedule charges
for it at the microbenchmarks' constants (:func:`schedule_groups`) and scales the
constants of that group by the ratio.
"""
from __future__ import annotations

import inspect
import time
from collections import defaultdict
from contextlib import contextmanager
from types import SimpleNamespace

import torch.distributed as dist

COPY_OPS = ("fsdp_copy_in", "fsdp_copy_out", "fsdp_rs_copy_in", "fsdp_rs_accumulate")  # the schedule's copy ops
_COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce")
_FSDP_FUNCTIONS = ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce")


def _ring_row(fn, args, kwargs, backend: str) -> tuple[str, int, int]:
    """(kind, the ring model's bytes S, group size) of one call of collective ``fn``: an
    all-gather's S is the gathered output; on gloo a reduce-scatter is an all-reduce of
    its whole input."""
    bound = inspect.signature(fn).bind(*args, **kwargs).arguments
    n = dist.get_world_size(bound.get("group"))
    if fn.__name__ == "all_gather_single":
        out = bound["output_tensor"]
        return "AllGather", out.numel() * out.element_size(), n
    if fn.__name__ == "reduce_scatter_single":
        inp = bound["input"]
        return ("AllReduce" if backend == "gloo" else "ReduceScatter"), inp.numel() * inp.element_size(), n
    t = bound["tensor"]
    return "AllReduce", t.numel() * t.element_size(), n


@contextmanager
def timed_step_pieces(spent: dict, comms: list, backend: str):
    """While inside: seconds in each of FSDP2's three functions and in the collectives
    (``spent``, by name), and one ``(kind, bytes, group size, seconds)`` per collective call
    (``comms``). The originals come back on exit, whatever happens inside."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

    saved = []

    def wrap(module, name, record: bool):
        inner = getattr(module, name)
        saved.append((module, name, inner))

        def call(*args, **kwargs):
            t = time.perf_counter()
            out = inner(*args, **kwargs)
            if record and out is not None and kwargs.get("async_op"):
                out.wait()  # FSDP2 waits on CPU ranks anyway; a call that returns early is timed to its end
            dt = time.perf_counter() - t
            if record:  # the row's own bookkeeping counts with the collective, not with FSDP2's copies
                comms.append((*_ring_row(inner, args, kwargs, backend), dt))
            spent[name] += time.perf_counter() - t
            return out
        setattr(module, name, call)
    try:
        for name in _FSDP_FUNCTIONS:
            wrap(group, name, False)
        for name in _COLLECTIVES:
            wrap(dist, name, True)
        yield
    finally:
        for module, name, inner in reversed(saved):
            setattr(module, name, inner)


def measure_fsdp_step(learner, steps: int = 10, warmup: int = 2) -> dict:
    """Per step (means over ``steps`` after ``warmup``) on this rank: ``passes_s`` (forward
    and backward less the collectives, FSDP2's copies and zero_grad: the passes and hooks),
    ``copies_s``, ``optimizer_s`` (step + zero_grad), ``comm_s``; and ``comms``, every
    collective call of the timed steps ``(kind, bytes, group size, seconds)`` in issue order."""
    from oresearcher.programs.divergence import sharded_forward_backward

    backend = dist.get_backend()
    opt = learner.optimizer

    def one_step():
        sharded_forward_backward(learner)
        learner.optimizer_step()
    for _ in range(warmup):
        one_step()
    dist.barrier()
    spent, comms = defaultdict(float), []
    zero = opt.zero_grad

    def timed_zero(*args, **kwargs):
        t = time.perf_counter()
        zero(*args, **kwargs)
        spent["zero_grad"] += time.perf_counter() - t
    opt.zero_grad = timed_zero  # an instance attribute: the class's method comes back when it is deleted
    fwd_bwd = step = 0.0
    try:
        with timed_step_pieces(spent, comms, backend):
            for _ in range(steps):
                t0 = time.perf_counter()
                sharded_forward_backward(learner)
                t1 = time.perf_counter()
                learner.optimizer_step()
                fwd_bwd, step = fwd_bwd + t1 - t0, step + time.perf_counter() - t1
    finally:
        del opt.zero_grad
    comm = sum(spent[n] for n in _COLLECTIVES)
    copies = max(0.0, sum(spent[n] for n in _FSDP_FUNCTIONS) - comm)
    return {"passes_s": max(0.0, fwd_bwd - comm - copies - spent["zero_grad"]) / steps,
            "copies_s": copies / steps, "optimizer_s": (step + spent["zero_grad"]) / steps,
            "comm_s": comm / steps, "comms": comms}


def schedule_groups(scenario, world: int, costs: dict) -> dict:
    """What the fsdp schedule on a CPU rank (no streams) charges rank 0 per step at the
    microbenchmarks' ``costs`` (calibration_fsdp.measure_fsdp_costs's keys), by group:
    ``copies_s`` (FSDP2's copies and bookkeeping), ``optimizer_s``, ``hooks_s``, and
    ``pass_flops`` (the FLOPs of the forward and backward passes)."""
    from oresearcher.ops import Compute
    from oresearcher.programs.fsdp import Schedule
    from oresearcher.programs.fsdp_costs import HostCosts

    hc = HostCosts(rate=1.0, bandwidth=costs["copy_Bps"], dtensor_param_s=costs["dtensor_param_step_s"],
                   streams=False, pass_rate=1.0, element_s=costs["optimizer_element_s"],
                   gather_param_s=costs["gather_param_s"], reduce_param_s=costs["reduce_param_s"],
                   unit_step_s=costs["unit_step_s"])
    sched = Schedule.build(SimpleNamespace(scenario=scenario, rank=0, world_size=world), costs=hc)
    by_name = defaultdict(float)

    def one_step():
        yield from sched.step()
        yield from sched.optimizer_dispatch()
    for op in one_step():  # every op answers None: payloads are meta, nothing is waited on
        if isinstance(op, Compute):
            by_name[op.name] += op.flops  # rate 1: a host op's FLOPs are its seconds
    return {"copies_s": sum(by_name[k] for k in COPY_OPS), "optimizer_s": by_name["fsdp_sharded_optimizer"],
            "hooks_s": by_name["fsdp_hooks"], "pass_flops": by_name["forward"] + by_name["backward"]}


def merge_steps(per_rank: list[dict]) -> dict:
    """Every rank's :func:`measure_fsdp_step` (without ``comms``) as lists over ranks."""
    keys = ("passes_s", "copies_s", "optimizer_s", "comm_s")
    return {k: [r[k] for r in per_rank] for k in keys}
