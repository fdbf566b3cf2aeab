"""Real fsdp runs: torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) per transformer
block, on gloo (CPU tensors) or NCCL. No hand-written sharding: FSDP2 shards every
parameter along dim 0 (DTensor), gathers a block before it computes, frees it after
(``fsdp.reshard_after_forward``) and reduce-scatters its gradients in backward, from its
own hooks, on its own streams. The fsdp program (:mod:`oresearcher.programs.fsdp`) runs
forward and backward in one Compute op for real; its per-block ops are the simulator's
cost model of that op.

    python -m oresearcher.run --backend=gloo --scenario scenarios/cpu-fsdp.yaml
    python -m oresearcher.run --backend=gloo --scenario scenarios/cpu-fsdp.yaml --set fsdp.shard_group_size=2
    python -m oresearcher.run --resume runs/cpu-fsdp/gloo --num_agents=2   # a stopped 4-rank run on 2 ranks

Units follow torchtitan: ``fully_shard(block)`` for every block (the last one keeps its
parameters gathered after forward: backward needs them at once), then
``fully_shard(model)`` for the root (embeddings, final norm, LM head). Every rank builds
the same full model from the scenario seed first, so the shards are slices of the one
base model. Mixed precision: sharded parameters stay fp32 (the optimizer's master copy);
blocks are gathered and computed in ``workload.dtype``; gradients are reduced in that
dtype or in fp32 (``fsdp.reduce_dtype``). HSDP (``fsdp.shard_group_size`` < ranks) is a
2-D DeviceMesh (replicate, shard).

Checkpoints: the learner's own ``state_dict()`` holds only its data stream; the model and
optimizer are saved and loaded by :mod:`oresearcher.backends.dcp` (``save_sharded`` /
``load_sharded``, called by the worker), which reshards them on a resume at another world
size.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from oresearcher.models import PRESETS, build_model, lm_loss
from oresearcher.programs.learner import DTYPES, TorchLearner
from oresearcher.sharding import scenario_plan
from oresearcher.tasks.synthetic_lm import TokenStream, micro_batch

from . import dcp


def device_mesh(scenario, world_size: int, device: torch.device):
    """1-D mesh over all ranks, or 2-D (replicate, shard) for HSDP."""
    size = scenario.fsdp.group_size(world_size)
    kind = device.type
    if size == world_size:
        return init_device_mesh(kind, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(kind, (world_size // size, size), mesh_dim_names=("replicate", "shard"))


def mixed_precision(scenario) -> MixedPrecisionPolicy:
    compute = DTYPES[scenario.workload.dtype]
    param = None if compute == torch.float32 else compute
    reduce = torch.float32 if scenario.fsdp.reduce_dtype == "fp32" else param
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


def shard_model(model, mesh, reshard_after_forward: bool, mp: MixedPrecisionPolicy):
    """fully_shard each block, then the root; returns the (same, now sharded) model."""
    last = len(model.blocks) - 1
    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward and i < last, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


class FSDPLearner(TorchLearner):
    """A TorchLearner over a fully_shard model; model and optimizer checkpoint through DCP."""

    def state_dict(self) -> dict:
        return {"data": self.batches.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "data" in state:
            self.batches.load_state_dict(state["data"])

    def save_sharded(self, step_dir) -> None:
        dcp.save(step_dir, self.module, self.optimizer)
        if dcp.is_rank0():
            dcp.prune(step_dir)

    def load_sharded(self, step_dir, keep_lr: bool = False) -> None:
        dcp.load(step_dir, self.module, self.optimizer, keep_lr=keep_lr)

    def full_state(self) -> dict:
        """The whole model, gathered (a collective; for tests and export)."""
        return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in self.module.state_dict().items()}


def make_learner(scenario, rank: int, world_size: int, device) -> FSDPLearner:
    """This rank's learner of a synthetic-lm scenario, its model sharded by fully_shard."""
    w = scenario.workload
    torch.manual_seed(scenario.seed)  # every rank builds the same base model, then keeps its shards
    model = build_model(w.model, device=device, dtype=torch.float32)
    model.activation_checkpointing = w.activation_checkpointing
    shard_model(model, device_mesh(scenario, world_size, device), scenario.fsdp.reshard_after_forward,
                mixed_precision(scenario))
    lr = scenario.training.lr
    optimizer = (torch.optim.AdamW(model.parameters(), lr=lr) if w.optimizer == "adamw"
                 else torch.optim.SGD(model.parameters(), lr=lr))
    batches = TokenStream(PRESETS[w.model].vocab_size, micro_batch(scenario), w.seq_len, scenario.seed, rank,
                          device=device)
    plan = scenario_plan(scenario)

    def loss_fn(module, batch):
        return lm_loss(module(batch[:, :-1]), batch[:, 1:])

    learner = FSDPLearner(model, optimizer, batches, loss_fn, fwd_flops=plan.fwd_flops, bwd_flops=plan.bwd_flops,
                          bucket_bytes=scenario.communication.bucket_bytes)
    learner.dtype = DTYPES[w.dtype]  # what it computes in: FSDP's policy casts, so the worker adds no autocast
    return learner
