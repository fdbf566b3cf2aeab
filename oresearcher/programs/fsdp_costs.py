"""The work torch's FSDP2 does beside the model's FLOPs, as the fsdp schedule prices it.

The simulator charges a block's forward and backward at the device's FLOP rate; FSDP2
(torch 2.13, ``torch/distributed/fsdp/_fully_shard``) also moves every unit's bytes
through memory around its collectives, and steps DTensor shards in the optimizer:

- all-gather copy-in (``all_gather_copy_in``): this rank's fp32 shard is read and written
  into the flat all-gather input in the gather dtype: ``N/S x (4 + p)`` bytes, N the
  unit's padded elements, S the shard group, p the gather (compute) dtype's size;
- all-gather copy-out (``split_with_sizes_copy``): the gathered buffer is copied into the
  unsharded parameters: ``2 N p`` bytes;
- reduce-scatter copy-in (``chunk_cat``): the unsharded gradients (dtype p) are copied into
  the flat reduce-scatter input (reduce dtype r): ``N (p + r)`` bytes;
- the project's divergence guard (``backends/fsdp/guard.py``) reads that flat input twice
  (amax, amin) and rewrites it (``masked_fill_``) before it leaves the rank: ``4 N r``;
- the reduced shard is cast to fp32 when r is not fp32 (``N/S x (r + 4)``) and added into
  the rank's sharded gradient (the learner keeps its gradients between steps,
  ``zero_grad(set_to_none=False)``: read two, write one, ``12 N/S`` bytes); after
  backward the program's finite check reads the shard twice more (amax, amin: ``8 N/S``).

Each is memory-bound: seconds = bytes / the device's memory bandwidth (read + write bytes
per second, ``DeviceProfile.memory_bandwidth_GBps``: a GPU's datasheet HBM figure, or
what ``oresearcher.calibrate`` measures on CPU ranks copying a block's bytes all at once).
On a GPU the all-gather copy-in runs on its own stream, and the guard and the shard's
accumulation on the reduce-scatter stream, beside compute; the copy-out and the chunk_cat
run on the compute stream, so with streams only those two are charged. A CPU rank does
all of it itself.

FSDP2 also runs Python over each unit's parameters around every collective (collecting
shards, resizing and viewing storages, wrapping gradients as DTensors): host time per
parameter per all-gather and per reduce-scatter (``DeviceProfile.fsdp_gather_param_us``,
``fsdp_reduce_param_us``, measured by ``oresearcher.calibrate`` with FSDP2's own functions
on a model of the scenario's parameter counts and one element per rank,
``backends/calibration/fsdp_hooks.py``), and its hooks (each unit's pre/post forward and
backward, the reshards) per unit per step (``fsdp_unit_step_us``, the same
microbenchmark's step beyond the unsharded model's and beyond those functions). Charged on
devices without streams; a GPU's host runs ahead of its kernels.

The optimizer steps DTensor shards: each elementwise op of the step goes through DTensor's
Python dispatch, a fixed host cost per op, so per parameter per step
(``DeviceProfile.dtensor_param_step_us``, measured by ``oresearcher.calibrate`` for the
scenario's optimizer: the step and ``zero_grad`` on DTensor shards minus the same on
plain tensors, per parameter). The elementwise work itself is in the device's rate, or,
where the passes are priced at their own rate (below), charged per local element at
``DeviceProfile.optimizer_element_ns`` (the same microbenchmark's plain step over the
rank's shards, per element).

A calibrated device's rate is its calibrated program's FLOPs over all of that program's
compute, so it folds in work the program does beside the model's passes (ddp: packing the
gradients into buckets, unpacking them, the optimizer step over whole tensors). FSDP2 does
none of that, so the schedule prices forward and backward at
``DeviceProfile.pass_flops_per_s`` where calibrate measured it: the calibrated program's
FLOP-declaring Compute ops alone.

The engine prices a Compute op as ``flops / rate`` (rate: the device's FLOP/s at the
workload's dtype), so a cost of ``t`` seconds is yielded as ``t x rate`` FLOPs
(:meth:`HostCosts.flops`), a unit conversion done here once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..comm.units import ns_to_s, us_to_s

FP32 = 4  # bytes: FSDP2 keeps the sharded parameters and gradients in fp32


def gather_copy_bytes(padded: int, n: int, p: int) -> tuple[float, float]:
    """(copy-in, copy-out) bytes moved by one all-gather of a unit of ``padded`` elements
    over ``n`` shards, gathered in a dtype of ``p`` bytes."""
    return padded / n * (FP32 + p), 2.0 * padded * p


def reduce_copy_bytes(padded: int, n: int, p: int, r: int) -> tuple[float, float, float]:
    """(copy-in, guard, accumulate and check) bytes moved by one reduce-scatter of a unit's
    gradients: computed in ``p`` bytes, reduced in ``r``, accumulated into the fp32 shard."""
    cast = padded / n * (r + FP32) if r != FP32 else 0.0
    return padded * (p + r), 4.0 * padded * r, cast + (3.0 + 2.0) * FP32 * padded / n


@dataclass(frozen=True)
class HostCosts:
    """Seconds of FSDP2's copies and DTensor dispatch, as FLOPs the engine charges.

    ``rate``: the engine's FLOP/s for Compute ops; ``bandwidth``: read + write bytes/s
    (None: copies are not priced); ``dtensor_param_s``: seconds per parameter per
    optimizer step; ``streams``: the device overlaps copy-in and accumulation (GPU)."""

    rate: float
    bandwidth: Optional[float] = None
    dtensor_param_s: float = 0.0
    streams: bool = True
    pass_rate: Optional[float] = None  # FLOP/s of forward/backward alone (None: ``rate``)
    element_s: float = 0.0  # a plain optimizer step per parameter element (charged with ``pass_rate``)
    gather_param_s: float = 0.0  # FSDP2's bookkeeping per parameter per all-gather (without streams)
    reduce_param_s: float = 0.0  # the same per reduce-scatter
    unit_step_s: float = 0.0  # FSDP2's hooks per unit per step (without streams)

    @classmethod
    def of(cls, device, dtype: str) -> "HostCosts":
        bw = device.memory_bandwidth if device.memory_bandwidth_GBps is not None else None
        flat = device.compute_model == "flat"  # the roofline prices passes by their kernels
        return cls(device.flops_per_s(dtype), bw, us_to_s(device.dtensor_param_step_us), device.streams,
                   device.pass_flops_per_s if flat else None, ns_to_s(device.optimizer_element_ns),
                   us_to_s(device.fsdp_gather_param_us), us_to_s(device.fsdp_reduce_param_us),
                   us_to_s(device.fsdp_unit_step_us))

    def passes(self, flops: float) -> float:
        """FLOPs to yield for a forward or backward of ``flops`` so that the engine, which
        charges ``rate``, takes ``flops / pass_rate`` seconds."""
        return flops if self.pass_rate is None else flops * self.rate / self.pass_rate

    def flops(self, seconds: float) -> float:
        return seconds * self.rate

    def copy_s(self, nbytes: float) -> float:
        return 0.0 if self.bandwidth is None else nbytes / self.bandwidth

    def gather_s(self, padded: int, n: int, p: int, params: int = 0) -> tuple[float, float]:
        """(before the collective, after it) seconds on the compute path of one all-gather
        of a unit of ``params`` parameters."""
        copy_in, copy_out = gather_copy_bytes(padded, n, p)
        if self.streams:
            return 0.0, self.copy_s(copy_out)
        return self.copy_s(copy_in), self.copy_s(copy_out) + params * self.gather_param_s

    def reduce_s(self, padded: int, n: int, p: int, r: int, params: int = 0) -> tuple[float, float]:
        """(before the collective, after it) seconds on the compute path of one reduce-scatter."""
        copy_in, guard, acc = reduce_copy_bytes(padded, n, p, r)
        if self.streams:
            return self.copy_s(copy_in), 0.0
        return self.copy_s(copy_in + guard), self.copy_s(acc) + params * self.reduce_param_s

    def hooks_s(self) -> float:
        """FSDP2's hooks of one unit in one step, charged with the unit's forward."""
        return 0.0 if self.streams else self.unit_step_s

    def optimizer_s(self, params: int, elements: int) -> float:
        """The sharded optimizer step of ``params`` DTensors holding ``elements`` locally:
        their dispatch, and with ``pass_rate`` (the device's rate no longer holds the
        optimizer) the plain step's work."""
        work = elements * self.element_s if self.pass_rate is not None else 0.0
        return params * self.dtensor_param_s + work
