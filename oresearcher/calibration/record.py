"""The measurement record: what one calibration run measured, as one typed value.

``backends/calibration/measure.py`` (rank 0, after gathering every rank's numbers) builds it; the
CLI (:mod:`oresearcher.calibrate`) adds what it knows of the program (its averaging
period, the roofline rates); the fabric fit (:mod:`.fabric_fit`), the jitter statistics
(:mod:`.jitter`) and the profile documents (:mod:`.profiles`) read it. Units are in the
names (seconds, FLOP); a field that was not measured keeps its default, which the
profile documents treat as "not measured" (no jitter, no in-run scaling, no roofline).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Optional, Union


@dataclass(frozen=True)
class Measurement:
    flops_per_step: float  # FLOPs the program's Compute ops declare per step (rank 0)
    compute_step_s: float  # slowest rank's mean compute seconds per step: the group's pace
    host_overhead_s: float  # median fixed cost of one Compute op on the host
    world_size: int = 1
    backend: str = ""  # gloo or nccl ("": not said)
    dtype: str = "fp32"
    strategy: str = "?"  # the calibrated program (training.strategy)
    call_overhead_s: float = 0.0  # median host cost of one collective call
    collectives: list = field(default_factory=list)  # the idle sweep: rows {kind, bytes, time_s, ...}
    inrun_collectives: list = field(default_factory=list)  # the program's own collectives, every rank busy
    # per in-run collective: the Compute ops' FLOPs (and steps) since the previous one and each rank's
    # time in it less the shortest, mean over ranks: rows {kind, flops, steps, wait_s} (merge_waits)
    arrival_waits: list = field(default_factory=list)
    wake_s: Optional[float] = None  # the fitted mean wake-up delay after a collective (None: not fitted yet)
    compute_step_s_mean: Optional[float] = None  # mean over ranks (None: compute_step_s)
    compute_step_s_per_rank: list = field(default_factory=list)
    compute_cv_per_rank: list = field(default_factory=list)  # std/mean of each rank's step seconds
    step_seconds_per_rank: list = field(default_factory=list)  # [rank][step] compute seconds
    op_flops: list = field(default_factory=list)  # FLOPs of each Compute op of one step
    compute_ops_per_step: float = 0.0
    sync_period: int = 1  # steps between the program's averagings (jitter persistence)
    roofline: Optional[dict] = None  # measured roofline rates (backends/calibration/device_rates.py), or None
    inrun_factor: float = 1.0  # in-run collectives / the idle sweep's fit (1: not applied)
    pass_step_s_per_rank: list = field(default_factory=list)  # seconds of the FLOP-declaring ops per step
    pass_ops_per_step: float = 0.0  # how many of the Compute ops declare FLOPs
    flops_per_step_per_rank: list = field(default_factory=list)  # each rank's declared FLOPs (programs whose ranks differ)
    compute_ops_per_step_per_rank: list = field(default_factory=list)
    host_link_Bps: Optional[float] = None  # one way: an agent's state out to host buffers and back (hosted agents)
    copy_Bps: Optional[float] = None  # read + write bytes/s copying a block, every rank at once (fsdp)
    dtensor_param_step_s: Optional[float] = None  # a DTensor shard's optimizer step over a plain one's (fsdp)
    optimizer_element_s: Optional[float] = None  # a plain optimizer step per local element (fsdp)
    gather_param_s: Optional[float] = None  # FSDP2's bookkeeping per parameter per all-gather (fsdp)
    reduce_param_s: Optional[float] = None  # the same per reduce-scatter (fsdp)
    unit_step_s: Optional[float] = None  # FSDP2's hooks per unit per step (fsdp)
    # the fsdp program's own step, timed by pieces (backends/calibration/fsdp_inrun.py): lists
    # over ranks of seconds per step (passes_s, copies_s, optimizer_s, comm_s), and
    # "schedule": what the schedule charges per step at the microbenchmarks' constants
    fsdp_step: Optional[dict] = None
    stolen_share: Optional[float] = None  # share of the CPU time the hypervisor took while calibration ran
    contention_change: Optional[float] = None  # how far a process's share of a core moved meanwhile (band.py)

    @property
    def mean_step_s(self) -> float:
        """Mean over ranks of the compute seconds per step."""
        return self.compute_step_s if self.compute_step_s_mean is None else self.compute_step_s_mean

    def with_(self, **changes) -> "Measurement":
        return replace(self, **changes)

    @classmethod
    def of(cls, m: Union["Measurement", Mapping[str, Any]]) -> "Measurement":
        """``m`` itself, or the record of a mapping with these field names (a test's
        literal, a record saved as JSON); TypeError names an unknown or missing field."""
        if isinstance(m, cls):
            return m
        unknown = set(m) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"not measurement fields: {', '.join(sorted(unknown))}")
        return cls(**m)
