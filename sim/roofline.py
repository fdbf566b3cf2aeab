"""The roofline compute model: a kernel's time is bounded by its arithmetic or its memory
traffic, whichever is slower, plus the cost of launching it.

    t(op) = max(flops / (peak[dtype] * achievable[cls]), bytes / (bandwidth * memory_efficiency))
            + launches * launch_s

(Williams, Waterman & Patterson 2009, "Roofline: an insightful visual performance model
for multicore architectures"). Ops and their FLOPs, bytes, launches and class (matmul,
attention, vector) come from :mod:`oresearcher.models.op_trace`, measured on the meta device.
Attention FLOPs are counted by torch over the full T x T score matrix; a causal kernel
computes half of it (FlashAttention skips the masked blocks), so attention ops are
charged ``CAUSAL_SHARE`` of their counted FLOPs at the kernel's published rate.

A flat FLOP rate (``peak * efficiency``) cannot see that small models are memory- and
launch-bound (elementwise ops, norms, the loss over a 50k vocabulary, optimizer passes)
while large matmuls run nearer peak; this model prices each kernel by its own bound.

What it does not see: cache reuse across kernels, kernels overlapping each other, and
the host running ahead of the GPU (launches are charged in series, an upper bound when
kernels are long, about right when they are short). The optimizer step is priced by the
same rule over its traced kernels (bytes dominate).

:class:`RooflinePricing` plugs into :class:`sim.engine.Engine`: Compute ops that run the
model (forward, backward, ...) are charged their FLOPs at the pass's roofline time per
FLOP, the ``optimizer`` op the optimizer's roofline time; other ops stay on the flat rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

CAUSAL_SHARE = 0.5  # of the counted attention FLOPs a causal kernel computes
MODEL_PASS_OPS = frozenset({"forward", "backward", "fwd_bwd", "fsdp_forward_backward", "sam_fwd_bwd",
                            "dp_fwd_bwd"})


@dataclass(frozen=True)
class Roofline:
    """Rates in FLOP/s, bytes/s, seconds (see :meth:`from_profile`)."""

    matmul_flops: float
    attention_flops: float
    vector_flops: float
    bandwidth: float
    launch_s: float

    @classmethod
    def from_profile(cls, device, dtype: str) -> "Roofline":
        if not device.has_roofline:
            raise ValueError(f"device profile {device.name} has no roofline fields")
        peak = device.peak_flops.get(dtype) or device.peak_flops["fp32"]
        a = device.achievable
        return cls(matmul_flops=peak * a["matmul"], attention_flops=peak * a["attention"],
                   vector_flops=device.peak_flops.get("fp32", peak) * a.get("vector", 1.0),
                   bandwidth=device.memory_bandwidth, launch_s=device.launch_s)

    def seconds(self, op) -> float:
        """Time of one traced op (:class:`oresearcher.models.op_trace.KernelOp`)."""
        if op.cls == "attention":
            compute = op.flops * CAUSAL_SHARE / self.attention_flops
        elif op.cls == "matmul":
            compute = op.flops / self.matmul_flops
        else:
            compute = op.flops / self.vector_flops
        return max(compute, op.bytes / self.bandwidth) + op.launches * self.launch_s

    def total(self, ops: Iterable) -> float:
        return sum(self.seconds(o) for o in ops)

    def breakdown(self, ops: Iterable) -> dict:
        """Seconds by bound: compute-bound, memory-bound and launch time."""
        out = {"compute_bound_s": 0.0, "memory_bound_s": 0.0, "launch_s": 0.0}
        for o in ops:
            t = self.seconds(o) - o.launches * self.launch_s
            memory = o.bytes / self.bandwidth
            out["memory_bound_s" if memory >= t else "compute_bound_s"] += t
            out["launch_s"] += o.launches * self.launch_s
        return out


@dataclass(frozen=True)
class StepPrice:
    """Roofline seconds of one micro batch's model pass and one optimizer step."""

    pass_s: float
    pass_flops: float
    optimizer_s: float

    @property
    def step_s(self) -> float:
        return self.pass_s + self.optimizer_s


def price_lm_step(device, model: str, micro_batch: int, seq_len: int, dtype: str, checkpointing: bool,
                  optimizer: str = "adamw") -> StepPrice:
    """Roofline price of one training step of preset ``model`` on ``device``."""
    from oresearcher.models.op_trace import optimizer_ops, pass_ops

    roof = Roofline.from_profile(device, dtype)
    ops = pass_ops(model, micro_batch, seq_len, dtype, checkpointing)
    opt = optimizer_ops(model, optimizer, device.foreach_optimizer)
    return StepPrice(roof.total(ops), sum(o.flops for o in ops), roof.total(opt))


class RooflinePricing:
    """``pricing(op_name, flops) -> seconds or None`` for the engine (None: flat rate).

    ``optimizer_share`` scales the optimizer step (1 / shard size under FSDP, whose
    ranks step only their shard)."""

    def __init__(self, price: StepPrice, optimizer_share: float = 1.0):
        self.per_flop = price.pass_s / price.pass_flops if price.pass_flops > 0 else 0.0
        self.optimizer_s = price.optimizer_s * optimizer_share

    def __call__(self, name: str, flops: float) -> Optional[float]:
        if name == "optimizer":
            return self.optimizer_s
        if name in MODEL_PASS_OPS:
            return flops * self.per_flop
        return None
