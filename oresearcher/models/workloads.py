"""What one training step of a model costs, measured by torch rather than by formulas.

- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over a forward and a backward pass
  of the real module (on the meta device for language-model presets, so a 70B model
  costs no memory and a couple of seconds). It counts matmuls, convolutions and
  attention kernels; elementwise ops, norms and softmax count zero, as in every
  published FLOP budget. Attention is counted over the full T x T score matrix, causal
  or not (torch's convention).
- Activation bytes: the bytes of the tensors autograd saves for backward during the
  forward pass, seen through ``torch.autograd.graph.saved_tensors_hooks`` and counted
  once per storage (views share one). Parameters and buffers are excluded: they are
  weights, not activations.
- With per-block activation checkpointing (Chen et al. 2016, "Training Deep Nets with
  Sublinear Memory Cost"), what stays saved is everything saved outside the blocks plus
  each block's inputs; during backward one block at a time is recomputed and holds its
  own saved tensors again. ``activation_bytes_ckpt`` is that peak, taken from the same
  measured pass by attributing each saved tensor to the block that saved it.
  ``recompute_flops`` is the forward FLOPs checkpointing runs a second time: each
  block's forward up to its last saved tensor, because torch's non-reentrant checkpoint
  stops recomputing once every saved tensor is back (early stop; an op saves its inputs
  before it runs, so a block's final projection is not recomputed). The FLOP counter is
  read at each save to find that point. Tests check both figures against a real
  ``torch.utils.checkpoint`` run.

Batch scaling: FLOPs are linear in the micro batch and activation bytes affine (a few
saved tensors, such as the rotary tables, do not depend on it), so ``measure_lm``
measures at micro batch 1 and 2 and extrapolates exactly; ``LMCost.at_micro_batch``
does the same arithmetic for another micro batch. The tests check this against direct
measurements.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from oresearcher.models import build_model, lm_loss

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# DistributedDataParallel caps its first gradient bucket (the last parameters, whose
# gradients are ready first in backward) at 1 MiB so communication starts early, and
# every later bucket at bucket_cap_mb (25 MiB); see torch.distributed's
# _DEFAULT_FIRST_BUCKET_BYTES and DDP's constructor.
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    """(identity, nbytes) of t's storage; views of one storage share the key.

    ``_cdata`` is the address of the StorageImpl, valid on meta tensors too (data_ptr is 0
    there). Callers keep the tensors alive while keys are compared, so addresses are not
    reused.
    """
    s = t.untyped_storage()
    return s._cdata, s.nbytes()


def _bytes(keys) -> int:
    return sum(nbytes for _, nbytes in keys)


@dataclass
class _Trace:
    """Raw result of one measured forward (+ backward) pass."""

    fwd_flops: int = 0
    bwd_flops: int = 0
    outside: set = field(default_factory=set)  # storage keys saved outside any block
    per_block: list = field(default_factory=list)  # storage keys saved by each block
    block_inputs: set = field(default_factory=set)  # storage keys of the blocks' inputs
    recompute_flops: int = 0  # sum over blocks of forward FLOPs up to the block's last save
    keep_alive: list = field(default_factory=list)  # so storage addresses are not reused

    def activation_bytes(self) -> int:
        return _bytes(set().union(self.outside, *self.per_block))

    def activation_bytes_ckpt(self) -> int:
        kept = self.outside | self.block_inputs
        recompute = max((_bytes(b - kept) for b in self.per_block), default=0)
        return _bytes(kept) + recompute


def _trace(module: nn.Module, inputs: Sequence, loss_fn: Callable, *,
           blocks: Sequence[nn.Module] = (), backward: bool = True) -> _Trace:
    """Run loss_fn(module(*inputs)) and its backward under FlopCounterMode and saved-tensor
    hooks. Backward goes through torch.autograd.grad, so no .grad is touched."""
    exclude = {_storage_key(t)[0] for t in (*module.parameters(), *module.buffers())}
    tr = _Trace(per_block=[set() for _ in blocks])
    current: list[Optional[int]] = [None]
    index = {id(b): i for i, b in enumerate(blocks)}
    counter = FlopCounterMode(display=False)
    start_flops, last_save_flops = [0], [0]

    def pack(t):
        if current[0] is not None:
            last_save_flops[0] = counter.get_total_flops()
        key = _storage_key(t)
        if key[0] not in exclude:
            tr.keep_alive.append(t)
            (tr.outside if current[0] is None else tr.per_block[current[0]]).add(key)
        return t

    def pre(block, args):
        current[0] = index[id(block)]
        start_flops[0] = last_save_flops[0] = counter.get_total_flops()
        for a in args:
            for t in (a if isinstance(a, (tuple, list)) else (a,)):
                if isinstance(t, torch.Tensor):
                    tr.keep_alive.append(t)
                    tr.block_inputs.add(_storage_key(t))

    def post(block, args, out):
        current[0] = None
        tr.recompute_flops += last_save_flops[0] - start_flops[0]

    handles = [h for b in blocks for h in (b.register_forward_pre_hook(pre),
                                           b.register_forward_hook(post))]
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(module(*inputs))
        tr.fwd_flops = counter.get_total_flops()
    finally:
        for h in handles:
            h.remove()
    wrt = [t for t in (*module.parameters(), *inputs)
           if isinstance(t, torch.Tensor) and t.requires_grad]
    if backward and wrt:
        with FlopCounterMode(display=False) as bwd_counter:
            torch.autograd.grad(loss, wrt)
        tr.bwd_flops = bwd_counter.get_total_flops()
    return tr


def measure_module(module: nn.Module, example_inputs: Sequence,
                   loss_fn: Callable[[object], torch.Tensor]) -> tuple[int, int, int]:
    """(fwd_flops, bwd_flops, activation_bytes) of loss_fn(module(*example_inputs)).

    Backward is taken with respect to the parameters and the inputs that require grad
    (an input that does not needs no input gradient: a first Linear layer's backward is
    then 1x its forward, not 2x). Works on real and meta tensors.
    Caveat: on CPU tensors FlopCounterMode counts F.scaled_dot_product_attention as 0
    FLOPs (the CPU flash kernel has no formula); measure attention models on meta.
    """
    tr = _trace(module, tuple(example_inputs), loss_fn)
    return tr.fwd_flops, tr.bwd_flops, tr.activation_bytes()


@dataclass(frozen=True)
class LMCost:
    """Per-GPU cost of one micro batch of a language-model preset. FLOPs, bytes.

    ``recompute_flops`` is what checkpointing adds (0 when ``checkpointing`` is False);
    ``step_flops`` is the total to charge. Both activation figures are always given so
    the memory model can weigh turning checkpointing on. ``*_fixed`` are the parts of
    the activation bytes that do not grow with the micro batch.
    """

    name: str
    micro_batch: int
    seq_len: int
    dtype: str
    checkpointing: bool
    params: int
    param_numels: tuple[int, ...]
    fwd_flops: int
    bwd_flops: int
    recompute_flops: int
    activation_bytes: int
    activation_bytes_ckpt: int
    activation_bytes_fixed: int
    activation_bytes_ckpt_fixed: int
    checkpoint_recompute_flops: int  # what recompute_flops is with checkpointing on

    @property
    def step_flops(self) -> int:
        return self.fwd_flops + self.bwd_flops + self.recompute_flops

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    def saved_activation_bytes(self, checkpointing: Optional[bool] = None) -> int:
        ckpt = self.checkpointing if checkpointing is None else checkpointing
        return self.activation_bytes_ckpt if ckpt else self.activation_bytes

    def at_micro_batch(self, micro_batch: int,
                       checkpointing: Optional[bool] = None) -> "LMCost":
        """The same workload at another micro batch (exact: FLOPs are linear in it,
        activation bytes affine), optionally toggling checkpointing."""
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        ckpt = self.checkpointing if checkpointing is None else checkpointing
        m, n = micro_batch, self.micro_batch
        act, act_c = self.activation_bytes_fixed, self.activation_bytes_ckpt_fixed
        extra = self.checkpoint_recompute_flops // n * m
        return replace(
            self, micro_batch=m, checkpointing=ckpt,
            fwd_flops=self.fwd_flops // n * m, bwd_flops=self.bwd_flops // n * m,
            checkpoint_recompute_flops=extra, recompute_flops=extra if ckpt else 0,
            activation_bytes=act + (self.activation_bytes - act) // n * m,
            activation_bytes_ckpt=act_c + (self.activation_bytes_ckpt - act_c) // n * m)


def _meta_lm_trace(name: str, micro_batch: int, seq_len: int, dtype: str,
                   backward: bool) -> _Trace:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    model = build_model(name, device="meta", dtype=DTYPES[dtype])
    tokens = torch.zeros(micro_batch, seq_len, dtype=torch.long, device="meta")
    return _trace(model, (tokens,), lambda logits: lm_loss(logits, tokens),
                  blocks=model.blocks, backward=backward)


@functools.lru_cache(maxsize=64)
def _unit_cost(name: str, seq_len: int, dtype: str) -> LMCost:
    """Measured at micro batch 1 (forward + backward) and 2 (forward only, for the
    batch-independent part of the activation bytes)."""
    one = _meta_lm_trace(name, 1, seq_len, dtype, backward=True)
    two = _meta_lm_trace(name, 2, seq_len, dtype, backward=False)
    a1, a2 = one.activation_bytes(), two.activation_bytes()
    c1, c2 = one.activation_bytes_ckpt(), two.activation_bytes_ckpt()
    numels = tuple(p.numel() for p in build_model(name).parameters())
    return LMCost(
        name=name, micro_batch=1, seq_len=seq_len, dtype=dtype, checkpointing=False,
        params=sum(numels), param_numels=numels, fwd_flops=one.fwd_flops,
        bwd_flops=one.bwd_flops, recompute_flops=0, activation_bytes=a1,
        activation_bytes_ckpt=c1, activation_bytes_fixed=2 * a1 - a2,
        activation_bytes_ckpt_fixed=2 * c1 - c2,
        checkpoint_recompute_flops=one.recompute_flops)


@functools.lru_cache(maxsize=256)
def measure_lm(name: str, micro_batch: int, seq_len: int, dtype: str = "bf16",
               checkpointing: bool = False) -> LMCost:
    """Cost of one micro batch of preset ``name`` (see oresearcher.models.PRESETS)."""
    if micro_batch < 1 or seq_len < 1:
        raise ValueError(f"micro_batch and seq_len must be >= 1, got {micro_batch}, {seq_len}")
    return _unit_cost(name, seq_len, dtype).at_micro_batch(micro_batch, checkpointing)


def bucket_sizes(param_numels: Sequence[int], bucket_bytes: int, element_size: int,
                 first_bucket_bytes: Optional[int] = DDP_FIRST_BUCKET_BYTES) -> list[int]:
    """Element counts of DDP-style gradient buckets, in the order they become ready.

    Parameters are taken in reverse registration order (backward produces the last
    layers' gradients first); a bucket closes as soon as it holds >= its cap in bytes
    (numel * element_size), so a parameter larger than the cap gets a bucket of its own
    and the last bucket may be smaller; none is empty. The first bucket's cap is
    ``first_bucket_bytes`` (DDP's 1 MiB by default; pass None for a uniform
    ``bucket_bytes``). Same assignment as torch.distributed's
    _compute_bucket_assignment_by_size for one dtype; DDP's later rebuild of buckets in
    gradient-ready order is not modelled.
    """
    if bucket_bytes <= 0 or element_size <= 0:
        raise ValueError("bucket_bytes and element_size must be positive")
    cap = bucket_bytes if first_bucket_bytes is None else first_bucket_bytes
    buckets, numel_in_bucket = [], 0
    for numel in reversed(param_numels):
        numel_in_bucket += numel
        if numel_in_bucket * element_size >= cap:
            buckets.append(numel_in_bucket)
            numel_in_bucket, cap = 0, bucket_bytes
    if numel_in_bucket:
        buckets.append(numel_in_bucket)
    return buckets


def per_rank_batch(scenario) -> int:
    """Samples each agent (rank) takes a step: ``workload.global_batch`` split over the
    agents, rounded down, at least one. Training, the simulator's price of a step and
    distillation all take this one split."""
    return max(1, scenario.workload.global_batch // scenario.agents.count)
