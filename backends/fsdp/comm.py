"""FSDP2's own collectives, timed, so a real fsdp run reports its communication like
every other strategy's.

FSDP2 all-gathers each unit's parameters and reduce-scatters its gradients from its own
hooks, inside the one Compute op that runs forward and backward: the interpreter never
sees those collectives as ops. FSDP2 takes its collectives from objects a module may
replace (``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``, public
hooks); :func:`install` puts timing ones in, wrapping whatever reduce-scatter is there
(the divergence guard's, :mod:`oresearcher.backends.fsdp.guard`). Each call is appended
to this process's :data:`LOG` (one rank per process) under the simulator's names
(``fsdp_all_gather``, ``fsdp_reduce_scatter``, as :mod:`oresearcher.programs.fsdp` yields
them) with the wire bytes the simulator's formula gives, and the interpreter's Compute
takes them out after the op (:func:`drain`): communication in flight, the rank blocked on
it, and the compute span less that time.

Only where the calls block: on CPU tensors (gloo) FSDP2 issues them synchronously, with
no side streams, so issue-to-return is the collective. On CUDA FSDP2 runs them on its own
streams and the call returns at launch; they are not recorded there (the figures stay
the Compute's, as before), and neither is an async all-gather (``unshard_async_op``,
which the project never sets). HSDP's all-reduce across replicas is ``dist.all_reduce``
called directly, with no hook: it stays inside compute time.
"""
from __future__ import annotations

import time

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

from oresearcher.comm.wire import wire_bytes  # the one formula prediction and measurement share

LOG: list[tuple[str, float, float, int]] = []  # (name, start, end, wire bytes), perf_counter seconds


def drain() -> list[tuple[str, float, float, int]]:
    """The collectives recorded since the last drain, oldest first."""
    out = list(LOG)
    LOG.clear()
    return out


def _wire(kind: str, tensor: torch.Tensor, group) -> int:
    return wire_bytes(kind, "ring", tensor.numel() * tensor.element_size(), group.size())


class TimedAllGather(DefaultAllGather):
    """FSDP's default all-gather, each blocking call recorded."""

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        t0 = time.perf_counter()
        work = super().__call__(output_tensor, input_tensor, group, async_op)
        if not async_op and input_tensor.device.type == "cpu":
            LOG.append(("fsdp_all_gather", t0, time.perf_counter(), _wire("AllGather", input_tensor, group)))
        return work


class TimedReduceScatter:
    """The reduce-scatter FSDP had (the divergence guard's), each blocking call recorded."""

    def __init__(self, inner):
        self.inner = inner

    def allocate(self, *args, **kwargs):
        return self.inner.allocate(*args, **kwargs)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        t0 = time.perf_counter()
        work = self.inner(output_tensor, input_tensor, group, op, async_op)
        if not async_op and input_tensor.device.type == "cpu":
            LOG.append(("fsdp_reduce_scatter", t0, time.perf_counter(),
                        _wire("ReduceScatter", input_tensor, group)))
        return work


def install(model, reduce_scatter) -> None:
    """Timing all-gather and reduce-scatter (around ``reduce_scatter``, the one the
    model's units already use) for every fully_shard unit of ``model``."""
    gather, scatter = TimedAllGather(), TimedReduceScatter(reduce_scatter)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(gather)
            module.set_custom_reduce_scatter(scatter)
