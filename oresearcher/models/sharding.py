"""Units of a sharded model: what FSDP gathers, computes and reduces, block by block.

torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) is applied the way torchtitan
applies it: once per transformer block and once to the whole model, whose own *root*
unit is what no block holds (token and position embeddings, the final norm, the LM
head). Each unit is one all-gather before it computes and one reduce-scatter of its
gradients after its backward. This module says how big each unit is and what it costs;
:mod:`oresearcher.programs.fsdp` turns that into the schedule of ops.

- Sizes: FSDP2 shards every parameter along dim 0 into ``n`` equal chunks, padding dim 0
  up to a multiple of ``n`` (``_chunk_with_empty`` in torch's ``_fsdp_param.py``), so a
  unit moves ``sum(ceil(dim0 / n) * n * rest)`` elements (:meth:`Unit.padded_numel`).
- FLOPs: ``FlopCounterMode`` over one forward *and* backward of the real module on the
  meta device attributes every FLOP to the module that ran it (its module tracker sees
  backward too). The root gets the rest (LM head forward and backward). Measured at
  micro batch 1 and scaled linearly, as :mod:`oresearcher.models.workloads` does; checkpointing's
  recompute FLOPs (measured there) are shared equally by the identical blocks.

Vocabulary: *unit* (a group of parameters FSDP gathers and reduces together), *shard
group* (the ranks one copy of the model is sharded over), *replicate group* (ranks that
hold the same shard, HSDP).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from . import build_model, lm_loss
from .workloads import DTYPES, measure_lm, per_rank_batch


@dataclass(frozen=True)
class Unit:
    """One FSDP unit: parameter shapes and per-micro-batch FLOPs."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    fwd_flops: float
    bwd_flops: float  # recompute (activation checkpointing) included

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def padded_numel(self, n: int) -> int:
        """Elements the unit's all-gather output holds with ``n`` shards (dim 0 padded)."""
        total = 0
        for s in self.shapes:
            rest = math.prod(s[1:]) if len(s) > 1 else 1
            total += math.ceil(s[0] / n) * n * rest if s else n
        return total


@dataclass(frozen=True)
class ShardPlan:
    """``root`` computes its forward after the blocks (LM head) and its backward before them."""

    root: Unit
    blocks: tuple[Unit, ...]

    @property
    def units(self) -> tuple[Unit, ...]:
        return (self.root, *self.blocks)

    @property
    def params(self) -> int:
        return sum(u.numel for u in self.units)

    @property
    def fwd_flops(self) -> float:
        return sum(u.fwd_flops for u in self.units)

    @property
    def bwd_flops(self) -> float:
        return sum(u.bwd_flops for u in self.units)


def local_part(t):
    """This rank's shard of a DTensor (FSDP2's sharded parameters and gradients), else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _shapes(module) -> tuple:
    return tuple(tuple(p.shape) for p in module.parameters())


@functools.lru_cache(maxsize=32)
def _unit_flops(name: str, seq_len: int, dtype: str) -> tuple:
    """(root fwd, root bwd, [(block fwd, block bwd)]) at micro batch 1, and shapes."""
    model = build_model(name, device="meta", dtype=DTYPES[dtype])
    tokens = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        loss = lm_loss(model(tokens), tokens)
        fwd = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
        torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    both = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    prefix = type(model).__name__ + ".blocks."
    blocks = [(fwd.get(f"{prefix}{i}", 0), both.get(f"{prefix}{i}", 0) - fwd.get(f"{prefix}{i}", 0))
              for i in range(len(model.blocks))]
    root = (fwd["Global"] - sum(f for f, _ in blocks), both["Global"] - fwd["Global"] - sum(b for _, b in blocks))
    block_ids = {id(p) for b in model.blocks for p in b.parameters()}
    root_shapes = tuple(tuple(p.shape) for p in model.parameters() if id(p) not in block_ids)
    return root, tuple(blocks), root_shapes, tuple(_shapes(b) for b in model.blocks)


def shard_plan(name: str, micro_batch: int, seq_len: int, dtype: str = "bf16",
               checkpointing: bool = False) -> ShardPlan:
    """The FSDP units of preset ``name`` training ``micro_batch`` sequences of ``seq_len``."""
    (rf, rb), blocks, root_shapes, block_shapes = _unit_flops(name, seq_len, dtype)
    m = int(micro_batch)
    recompute = measure_lm(name, m, seq_len, dtype, checkpointing).recompute_flops / max(len(blocks), 1)
    units = tuple(Unit(f"block{i}", shapes, f * m, b * m + recompute)
                  for i, ((f, b), shapes) in enumerate(zip(blocks, block_shapes)))
    return ShardPlan(Unit("root", root_shapes, rf * m, rb * m), units)


def scenario_plan(scenario) -> ShardPlan:
    """The plan of a synthetic-lm scenario (its micro batch is the global batch per agent)."""

    w = scenario.workload
    return shard_plan(w.model, per_rank_batch(scenario), w.seq_len, w.dtype, w.activation_checkpointing)


def shard_groups(rank: int, world_size: int, group_size: int) -> tuple[tuple, tuple]:
    """(shard group, replicate group) of ``rank``: consecutive ranks shard one copy (as a
    2-D DeviceMesh of shape (world / group_size, group_size) lays them out); ranks at the
    same place in every copy replicate each other."""
    if group_size < 1 or world_size % group_size:
        raise ValueError(f"shard group size {group_size} does not divide world size {world_size}")
    first = rank // group_size * group_size
    shard = tuple(range(first, first + group_size))
    replicate = tuple(range(rank % group_size, world_size, group_size))
    return shard, replicate
