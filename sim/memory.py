"""Per-GPU memory of one data-parallel replica, and what to change when it does not fit.

Parts (all bytes, "GB" = 10^9 bytes):

- weights, grads, optimizer_state: per parameter, as the learner holds them
  (``oresearcher/models/learner.py``). Mixed precision (bf16/fp16) is autocast over an
  fp32 module: the parameters are the fp32 master weights (4 bytes), their gradients are
  fp32 (4) and AdamW's two moments are fp32 (8): 4 + 4 + 8 = 16 bytes/param (the bf16
  weight copies autocast makes live for one forward and backward; they are not charged
  here). This is the same
  total as ZeRO's split (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
  Training Trillion Parameter Models", section 3.1: 2-byte working weight, 2-byte
  gradient, 12 bytes of master weight + moments), which keeps bf16 parameters and
  gradients resident; the split matters for what a checkpoint saves (weights + optimizer
  state: 12 bytes/param here, 14 in ZeRO's split). SGD charges one fp32 momentum buffer
  (4), so mixed and fp32 training hold the same: 4 + 4 + 8 (AdamW), 4 + 4 + 4 (SGD with
  momentum, as every task's learner builds it).
- activations: the saved-for-backward bytes measured by ``oresearcher.models.workloads``
  (with or without per-block activation checkpointing) at the given micro batch.
- codec_buffers: what the gradient codec keeps (error-feedback residuals, compressed
  send/receive buffers); the caller passes it.

Not modelled: the CUDA context and allocator fragmentation (a few GB on a real device;
pass a smaller ``device_memory_bytes`` to keep headroom), transient buffers of a single
kernel, and sharded states: a replica here holds everything (:func:`estimate_fsdp_memory`
prices FSDP's sharded ranks).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from oresearcher.models.workloads import LMCost
from oresearcher.reporting.units import format_bytes

OPTIMIZERS = ("adamw", "sgd")

# (weight, grad, optimizer state) bytes per parameter; see the module docstring.
_BYTES_PER_PARAM = {
    ("mixed", "adamw"): (4, 4, 8),  # autocast over fp32 masters: what the learner holds
    ("mixed", "sgd"): (4, 4, 4),
    ("fp32", "adamw"): (4, 4, 8),
    ("fp32", "sgd"): (4, 4, 4),
}


def bytes_per_param(dtype: str, optimizer: str) -> tuple[int, int, int]:
    """(weight, grad, optimizer state) bytes per parameter for training dtype and optimizer."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype must be bf16, fp16 or fp32, got {dtype!r}")
    return _BYTES_PER_PARAM["fp32" if dtype == "fp32" else "mixed", optimizer]


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes by part. ``fix_micro_batch``/``fix_checkpointing`` is the first
    setting found to fit (None when it already fits or only sharding would help)."""

    weights: int
    grads: int
    optimizer_state: int
    activations: int
    codec_buffers: int
    total: int
    device_memory_bytes: int
    fits: bool
    advice: str = ""
    fix_micro_batch: Optional[int] = None
    fix_checkpointing: Optional[bool] = None

    @property
    def model_states(self) -> int:
        """weights + grads + optimizer state: what no micro batch setting can shrink."""
        return self.weights + self.grads + self.optimizer_state


def _estimate(cost: LMCost, micro_batch: int, dtype: str, optimizer: str,
              checkpointing: bool, codec_buffer_bytes: int,
              device_memory_bytes: int) -> MemoryEstimate:
    w, g, o = bytes_per_param(dtype, optimizer)
    acts = cost.at_micro_batch(micro_batch).saved_activation_bytes(checkpointing)
    parts = (w * cost.params, g * cost.params, o * cost.params, acts, codec_buffer_bytes)
    total = sum(parts)
    return MemoryEstimate(*parts, total=total, device_memory_bytes=device_memory_bytes,
                          fits=total <= device_memory_bytes)


def _candidates(micro_batch: int, checkpointing: bool):
    """Settings to try, in order: checkpointing alone; halving the micro batch (repeat)
    at the current checkpointing setting; then both."""
    halvings = []
    m = micro_batch // 2
    while m >= 1:
        halvings.append(m)
        m //= 2
    if not checkpointing:
        yield micro_batch, True
    yield from ((m, checkpointing) for m in halvings)
    if not checkpointing:
        yield from ((m, True) for m in halvings)


def estimate_memory(cost: LMCost, *, micro_batch: Optional[int] = None,
                    dtype: Optional[str] = None, optimizer: str = "adamw",
                    checkpointing: Optional[bool] = None, codec_buffer_bytes: int = 0,
                    device_memory_bytes: int) -> MemoryEstimate:
    """Per-GPU memory of training ``cost``'s model; ``None`` takes the value from ``cost``.

    When it does not fit, ``advice`` names the first option that does, checked by
    recomputing with it: enable activation checkpointing, halve the micro batch
    (repeatedly), both, or else model sharding.
    """
    mb = cost.micro_batch if micro_batch is None else micro_batch
    ckpt = cost.checkpointing if checkpointing is None else checkpointing
    dtype = cost.dtype if dtype is None else dtype
    if dtype != cost.dtype:
        raise ValueError(f"cost was measured in {cost.dtype}, not {dtype}: "
                         f"measure_lm(..., dtype={dtype!r}) first")
    if mb < 1 or codec_buffer_bytes < 0 or device_memory_bytes <= 0:
        raise ValueError("need micro_batch >= 1, codec_buffer_bytes >= 0, device memory > 0")
    args = (dtype, optimizer)
    tail = (codec_buffer_bytes, device_memory_bytes)
    est = _estimate(cost, mb, *args, ckpt, *tail)
    if est.fits:
        return est
    of = f"of {format_bytes(device_memory_bytes)}"
    for m, c in _candidates(mb, ckpt):
        trial = _estimate(cost, m, *args, c, *tail)
        if trial.fits:
            steps = []
            if c != ckpt:
                steps.append("enable activation checkpointing")
            if m != mb:
                steps.append(f"reduce micro batch from {mb} to {m}")
            advice = f"{' and '.join(steps)} (then {format_bytes(trial.total)} {of})"
            return _with(est, advice, m, c)
    advice = (f"needs model sharding (training.strategy: fsdp): the weights+grads+optimizer state "
              f"alone need {format_bytes(est.model_states)} {of}")
    if est.model_states <= device_memory_bytes:
        least = _estimate(cost, 1, *args, True, *tail)
        advice += (f", and even micro batch 1 with activation checkpointing needs "
                   f"{format_bytes(least.total)}")
    return _with(est, advice, None, None)


def _with(est: MemoryEstimate, advice: str, m, c) -> MemoryEstimate:
    return replace(est, advice=advice, fix_micro_batch=m, fix_checkpointing=c)


@dataclass(frozen=True)
class FsdpMemory:
    """Per-GPU bytes of one FSDP rank (see :func:`estimate_fsdp_memory`)."""

    sharded_params: int
    sharded_grads: int
    optimizer_state: int
    gathered_params: int
    grad_buffers: int
    activations: int
    total: int
    device_memory_bytes: int
    fits: bool
    sam_saved: int = 0  # a SAM agent's copy of its rank's shard, held through its step

    @property
    def sharded_states(self) -> int:
        return self.sharded_params + self.sharded_grads + self.optimizer_state


@dataclass(frozen=True)
class FsdpSetup:
    """What FSDP2 shards and how: the model's parameters (a root and ``blocks`` equal
    blocks, each its own ``fully_shard`` unit), the shard group and the mixed-precision,
    optimizer and resharding policy."""

    params: int
    root_params: int
    block_params: int
    blocks: int
    shard_size: int
    compute_dtype: str
    reduce_fp32: bool
    optimizer: str
    reshard_after_forward: bool


def estimate_fsdp_memory(setup: FsdpSetup, *, activation_bytes: int, device_memory_bytes: int,
                         sam: bool = False) -> FsdpMemory:
    """Per-GPU memory of FSDP2 training (torch's ``fully_shard`` per block, root = the rest).

    - sharded states: FSDP2 keeps the sharded parameters in fp32 (the mixed-precision
      policy casts them to the compute dtype when it gathers), their fp32 gradients and
      the optimizer state (AdamW: two fp32 moments; SGD: one momentum buffer, the
      convention of :func:`bytes_per_param`), each 1/``shard_size`` of the model:
      16 bytes/param / S with AdamW, ZeRO-3's figure (Rajbhandari et al. 2020, 3.1).
    - gathered parameters in the compute dtype: the root (never resharded) plus, with
      ``reshard_after_forward`` (ZeRO-3), two blocks: the one computing and the one
      prefetched; without it (ZeRO-2) every block stays gathered from forward to backward.
    - gradient buffers in the reduce dtype: the root's (its head gradient is computed
      first and reduced last), the block in backward and the block whose reduce-scatter
      is in flight.
    - activations: as measured for DDP (the same saved tensors).
    - ``sam`` (a sharded agent whose role may take SAM steps): the rank's fp32 shard saved
      before the ascent and restored after it (oresearcher/cooperation/sharded_roles.py),
      4 bytes/param / S, held through the second forward and backward.

    Peaks of the parts are added, so the total is an upper bound by at most the smaller
    transient. Not modelled: the all-gather/reduce-scatter output copies of a single
    collective, the CUDA context and allocator fragmentation.
    """
    s = setup
    if s.shard_size < 1 or s.blocks < 0 or min(s.params, s.root_params, s.block_params, activation_bytes) < 0:
        raise ValueError("need shard_size >= 1 and non-negative sizes")
    p = 4 if s.compute_dtype == "fp32" else 2
    r = 4 if s.reduce_fp32 else p
    opt = bytes_per_param("fp32", s.optimizer)[2]
    shard = -(-s.params // s.shard_size)  # ceil: padded shards
    held_blocks = min(2, s.blocks) if s.reshard_after_forward else s.blocks
    parts = dict(sharded_params=4 * shard, sharded_grads=4 * shard, optimizer_state=opt * shard,
                 gathered_params=p * (s.root_params + held_blocks * s.block_params),
                 grad_buffers=r * (s.root_params + min(2, s.blocks) * s.block_params),
                 activations=int(activation_bytes), sam_saved=4 * shard if sam else 0)
    total = sum(parts.values())
    return FsdpMemory(**parts, total=total, device_memory_bytes=int(device_memory_bytes),
                      fits=total <= device_memory_bytes)
