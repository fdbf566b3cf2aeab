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
2-D DeviceMesh (replicate, shard). With ``fsdp.replicas: fusion`` each row of that mesh
is an agent of its own: its model is sharded over the row's 1-D sub-mesh (no gradient
all-reduce between agents), the program fuses the agents' local shards every
``communication.interval`` steps (:mod:`oresearcher.cooperation.sharded_fusion`), and each agent
checkpoints its own DCP folder (``dcp-agent<a>``: the agents hold different models, which
one DCP folder for the world would take for replicas and save once).

Checkpoints: the learner's own ``state_dict()`` holds only its data stream; the model and
optimizer are saved and loaded by :mod:`oresearcher.backends.checkpoint.dcp` (``save_sharded`` /
``load_sharded``, called by the worker), which reshards them on a resume at another world
size.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from oresearcher.backends.checkpoint import dcp
from oresearcher.models import PRESETS, build_model, lm_loss
from oresearcher.models.learner import DTYPES, TorchLearner
from oresearcher.models.sharding import local_part, scenario_plan
from oresearcher.models.workloads import per_rank_batch
from oresearcher.tasks.synthetic_lm import TokenStream

from . import comm as fsdp_comm, guard as fsdp_guard


def device_mesh(scenario, world_size: int, device: torch.device):
    """1-D mesh over all ranks, 2-D (replicate, shard) for HSDP, or this agent's row of it
    for sharded agents (``fsdp.replicas: fusion``)."""
    size = scenario.fsdp.group_size(world_size)
    kind = device.type
    if size == world_size:
        return init_device_mesh(kind, (world_size,), mesh_dim_names=("shard",))
    mesh = init_device_mesh(kind, (world_size // size, size), mesh_dim_names=("replicate", "shard"))
    return mesh["shard"] if scenario.fsdp.replicas == "fusion" else mesh


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
    """A TorchLearner over a fully_shard model; model and optimizer checkpoint through DCP.

    ``agent``/``agent_group``: set for sharded agents (their own DCP folder and group)."""

    agent = None
    agent_group = None
    sharded = True  # save_sharded/load_sharded: model and optimizer through DCP

    def state_dict(self) -> dict:
        return {"data": self.batches.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "data" in state:
            self.batches.load_state_dict(state["data"])

    def save_sharded(self, step_dir) -> None:
        dcp.save(step_dir, self.module, self.optimizer, agent=self.agent, group=self.agent_group)
        if dcp.is_rank0():
            dcp.prune(step_dir)

    def load_sharded(self, step_dir, keep_lr: bool = False) -> None:
        dcp.load(step_dir, self.module, self.optimizer, keep_lr=keep_lr, agent=self.agent, group=self.agent_group)

    def _local(self) -> list[torch.Tensor]:
        return [local_part(p) for p in self.module.parameters()]

    @torch.no_grad()
    def local_flat(self) -> torch.Tensor:
        """This rank's shard of every parameter, flat (what a shard-wise fusion moves)."""
        return torch.cat([t.detach().reshape(-1) for t in self._local()])

    @torch.no_grad()
    def set_local_flat(self, flat: torch.Tensor) -> None:
        offset = 0
        for t in self._local():
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def full_state(self) -> dict:
        """The whole model, gathered (a collective; for tests and export)."""
        return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in self.module.state_dict().items()}


def make_learner(scenario, rank: int, world_size: int, device) -> FSDPLearner:
    """This rank's learner of a synthetic-lm scenario, its model sharded by fully_shard."""
    w = scenario.workload
    torch.manual_seed(scenario.seed)  # every rank builds the same base model, then keeps its shards
    model = build_model(w.model, device=device, dtype=torch.float32)
    model.activation_checkpointing = w.activation_checkpointing
    mesh = device_mesh(scenario, world_size, device)
    shard_model(model, mesh, scenario.fsdp.reshard_after_forward, mixed_precision(scenario))
    lr = scenario.training.lr
    optimizer = (torch.optim.AdamW(model.parameters(), lr=lr) if w.optimizer == "adamw"
                 else torch.optim.SGD(model.parameters(), lr=lr))
    batches = TokenStream(PRESETS[w.model].vocab_size, per_rank_batch(scenario), w.seq_len, scenario.seed, rank,
                          device=device)
    plan = scenario_plan(scenario)

    def loss_fn(module, batch):
        return lm_loss(module(batch[:, :-1]), batch[:, 1:])

    learner = FSDPLearner(model, optimizer, batches, loss_fn, fwd_flops=plan.fwd_flops, bwd_flops=plan.bwd_flops,
                          bucket_bytes=scenario.communication.bucket_bytes)
    learner.dtype = DTYPES[w.dtype]  # what it computes in: FSDP's policy casts, so the worker adds no autocast
    learner.reduce_check = fsdp_guard.install(model)  # non-finite gradients stop before they are shared
    fsdp_comm.install(model, learner.reduce_check)  # FSDP2's collectives in the report (blocking ones: CPU)
    if scenario.fsdp.replicas == "fusion":
        learner.agent, learner.agent_group = rank // scenario.fsdp.group_size(world_size), mesh.get_group()
    return learner
