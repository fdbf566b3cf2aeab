"""Per-kernel FLOPs and bytes of one training step, measured on the meta device.

A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every aten op of a
forward + backward pass (with activation checkpointing, its recompute too) and of an
optimizer step, on meta tensors, so a 1.3B model costs no memory. For each op that
launches a kernel it records:

- ``flops``: FlopCounterMode's own formula for the op (``torch.utils.flop_counter.
  flop_registry``: matmuls, convolutions, attention; elementwise ops count 0), so the
  total equals what :mod:`oresearcher.models.workloads` counts;
- ``bytes``: every tensor the op reads (its tensor arguments) plus every tensor it
  writes (its outputs; an in-place op's output is its first argument, written back),
  at their element sizes. Caches are not modelled: each op streams its operands once;
- ``launches``: 1, or for a ``_foreach_*`` op the kernels CUDA's multi_tensor_apply
  launches for its tensor lists (ATen's MultiTensorApply.cuh: at most 110/64/48/36/30
  tensors for 1..5 lists and 320 blocks of 65,536 elements per launch), or one per
  tensor where ``foreach`` is off (CPU runs AdamW's per-tensor loop);
- ``cls``: "attention" (scaled-dot-product kernels), "matmul" (other ops with FLOPs) or
  "vector" (everything else), the classes a device profile gives achievable rates for.

Views, detach, empty allocations and host scalar reads launch no kernel and are skipped.

Mixed precision (fp32 master weights, bf16 compute via autocast; see
``oresearcher.models.learner``): autocast does not act on meta tensors, so the pass
is traced on a model built in the compute dtype, and the casts autocast adds are added
by hand: each weight cast to bf16 once per forward (and once more per recompute with
checkpointing: read 4 + write 2 bytes per parameter) and each bf16 gradient cast back to
fp32 (read 2 + write 4). The optimizer is traced on fp32 parameters and gradients.

Batch scaling: bytes are affine in the micro batch and FLOPs linear, op by op, so the
pass is traced at micro batch 1 and 2 and extrapolated (tests check against a direct
trace). The optimizer's second step is traced (the first one allocates its state).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from . import PRESETS, build_model, lm_loss

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NO_KERNEL = {"detach", "lift_fresh", "alias", "_unsafe_view", "empty", "empty_like", "empty_strided",
             "new_empty", "new_empty_strided", "_local_scalar_dense", "_record_function_enter_new",
             "_record_function_exit", "set_", "resize_"}
ATTENTION = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
             "_flash_attention_forward", "_flash_attention_backward"}
FOREACH_MAX_TENSORS = (110, 64, 48, 36, 30)  # by number of tensor lists, MultiTensorApply.cuh
FOREACH_ELEMENTS_PER_LAUNCH = 320 * 65536


@dataclass(frozen=True)
class KernelOp:
    name: str
    cls: str  # "matmul" | "attention" | "vector"
    flops: float
    bytes: float
    launches: int


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _foreach_launches(args, foreach: bool) -> int:
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    if not lists:
        return 1
    n = len(lists[0])
    if not foreach:
        return n
    per = FOREACH_MAX_TENSORS[min(len(lists), len(FOREACH_MAX_TENSORS)) - 1]
    elements = sum(t.numel() for t in lists[0])
    return max(math.ceil(n / per), math.ceil(elements / FOREACH_ELEMENTS_PER_LAUNCH))


class KernelRecorder(TorchDispatchMode):
    """Records a :class:`KernelOp` per kernel-launching aten op (see the module docstring)."""

    def __init__(self, foreach: bool = True):
        super().__init__()
        self.foreach, self.ops = foreach, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or name in NO_KERNEL:
            return out
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if name.endswith("_") and not outs:  # in-place foreach ops return nothing: they write arg 0
            outs = [t for t in tree_flatten(args[0])[0] if isinstance(t, torch.Tensor)]
        packet = func.overloadpacket
        flops = float(flop_registry[packet](*args, **kwargs, out_val=out)) if packet in flop_registry else 0.0
        cls = "attention" if name in ATTENTION else "matmul" if flops > 0 else "vector"
        launches = _foreach_launches(args, self.foreach) if name.startswith("_foreach") else 1
        self.ops.append(KernelOp(name, cls, flops, float(sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))), launches))
        return out


def _pass_ops(name: str, micro_batch: int, seq_len: int, dtype: str, checkpointing: bool) -> list[KernelOp]:
    model = build_model(name, device="meta", dtype=DTYPES[dtype])
    model.activation_checkpointing = checkpointing
    tokens = torch.zeros(micro_batch, seq_len, dtype=torch.long, device="meta")
    rec = KernelRecorder()
    with rec:
        lm_loss(model(tokens), tokens).backward()
    return rec.ops


def _extrapolate(one: list[KernelOp], two: list[KernelOp], micro_batch: int) -> list[KernelOp]:
    if [o.name for o in one] != [o.name for o in two]:
        raise RuntimeError("the traced pass differs between micro batch 1 and 2; cannot extrapolate")
    m = micro_batch
    return [KernelOp(a.name, a.cls, a.flops * m, a.bytes + (b.bytes - a.bytes) * (m - 1), a.launches)
            for a, b in zip(one, two)]


def _cast_ops(numel: int, tensors: int, casts_per_forward: int) -> list[KernelOp]:
    """What autocast adds per step: each weight cast fp32 -> bf16 (read 4, write 2 bytes
    per parameter, one kernel per tensor), each gradient cast back (read 2, write 4)."""
    return ([KernelOp("autocast_weight_cast", "vector", 0.0, 6.0 * numel, tensors)] * casts_per_forward
            + [KernelOp("autocast_grad_cast", "vector", 0.0, 6.0 * numel, tensors)])


@functools.lru_cache(maxsize=64)
def pass_ops(name: str, micro_batch: int, seq_len: int, dtype: str = "bf16",
             checkpointing: bool = False) -> tuple[KernelOp, ...]:
    """Kernels of one forward + backward (+ recompute) of preset ``name``; with a 16-bit
    ``dtype`` the pass is mixed precision (autocast casts added, see the docstring)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}")
    one = _pass_ops(name, 1, seq_len, dtype, checkpointing)
    ops = one if micro_batch == 1 else _extrapolate(one, _pass_ops(name, 2, seq_len, dtype, checkpointing),
                                                  micro_batch)
    if dtype != "fp32":
        numels = [p.numel() for p in build_model(name, device="meta").parameters()]
        casts = 2 if checkpointing else 1  # recompute runs outside autocast's cast cache
        ops = list(ops) + _cast_ops(sum(numels), len(numels), casts)
    return tuple(ops)


@functools.lru_cache(maxsize=64)
def optimizer_ops(name: str, optimizer: str = "adamw", foreach: bool = True) -> tuple[KernelOp, ...]:
    """Kernels of one steady-state optimizer step over preset ``name``'s fp32 parameters
    (torch.optim defaults: AdamW lr 1e-3, SGD without momentum; ``foreach`` as on CUDA)."""
    model = build_model(name, device="meta", dtype=torch.float32)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.empty_like(p)
    opt = (torch.optim.AdamW(params, lr=1e-3, foreach=foreach) if optimizer == "adamw"
           else torch.optim.SGD(params, lr=1e-3, foreach=foreach))
    opt.step()  # allocates the state
    rec = KernelRecorder(foreach=foreach)
    with rec:
        opt.step()
    return tuple(rec.ops)
