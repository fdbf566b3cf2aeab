"""``fsdp``: fully sharded data parallel (ZeRO-3, or ZeRO-2 without resharding), as torch's
FSDP2 (``torch.distributed.fsdp.fully_shard``) runs it, per transformer block.

Each rank keeps 1/S of every parameter, gradient and optimizer state (S ranks per shard
group, ``fsdp.shard_group_size``; Rajbhandari et al. 2020, "ZeRO", stage 3). The schedule
of one step, per unit of :mod:`oresearcher.models.sharding` (root = embeddings + final norm +
LM head, then the blocks):

- forward: all-gather the root and block 1, then before block i computes, issue block
  i+1's all-gather (FSDP2's forward prefetch: the CPU runs one block ahead of the GPU,
  and the all-gather stream overlaps the compute stream). With
  ``fsdp.reshard_after_forward`` a block frees its gathered parameters after its forward,
  except the last, which backward needs at once (torchtitan's setting); the root never
  reshards (FSDP2 keeps the root unsharded).
- backward: the root's LM head first; then, for blocks L..1: wait for the block's
  all-gather (if it was resharded), issue the all-gather of the block below (FSDP2's
  backward prefetch), compute the block's backward, issue its gradient reduce-scatter
  (async, on its own stream). With HSDP (S < world) each reduced shard is then
  all-reduced across the replicate group, once the reduce-scatter it follows is done
  (FSDP2 runs both on the reduce-scatter stream, in that order). The root's embedding
  gradients come last, and so does its reduce-scatter.
- the optimizer steps on the local shards: no communication.

With ``fsdp.replicas: fusion`` the shard groups are independent *agents*: no gradient
all-reduce across them; every ``communication.interval`` steps they fuse shard by shard
(:mod:`oresearcher.cooperation.sharded_fusion`, the attention-weighted round of
:mod:`oresearcher.cooperation.fusion` without full copies), each agent's reliability exp(-loss) from
its ranks' mean loss on their disjoint held-out batches, evaluated before the round
(:mod:`oresearcher.cooperation.sharded_validation`; the per-token likelihood, in (0, 1]). With
``agents.roles`` the agents keep roles (:mod:`oresearcher.cooperation.sharded_roles`): an
explorer's lr is scaled and its shards noised after each round, an optimizer's SAM step runs
the schedule twice (the other agents wait for it at the round), a validator trains plainly.

Beside the collectives and the model's FLOPs the schedule prices what FSDP2 does around
them (:mod:`.fsdp_costs`): the copies into and out of every all-gather and reduce-scatter
buffer at the device's memory bandwidth, and the optimizer step on DTensor shards.

Payload dtypes follow the mixed-precision policy: all-gathers in the compute dtype
(``workload.dtype``), reduce-scatters in ``fsdp.reduce_dtype`` (fp32 or the compute dtype).

Design note: **the real backend delegates to torch's FSDP inside a higher-level op.** On
torch.distributed (``ctx.mode == "real"``) the learner's module is sharded by
``fully_shard`` (:mod:`oresearcher.backends.fsdp.learner`) and one ``Compute`` runs forward and
backward: FSDP2's hooks issue the all-gathers and reduce-scatters themselves, on their
own streams, which is what makes the run torch's FSDP and not a re-implementation. The
per-block ops below are the cost model of that Compute, kept beside it in this module,
and the simulator prices them (shape mode: sizes only, no math).
"""
from __future__ import annotations

import torch

from ..errors import UserError
from ..ops import AllGather, AllReduce, Compute, ReduceScatter, StepDone, Wait
from ..cooperation.sharded_fusion import fuse_sharded
from ..cooperation.sharded_roles import OnBatch, RoleStep
from ..cooperation.sharded_validation import eval_forward, heldout_batch, heldout_loss
from .divergence import Guard, guard_sharded, sharded_forward_backward
from ..models.sharding import scenario_plan, shard_groups
from .fsdp_costs import HostCosts
from ..models.learner import DTYPES


def fsdp(ctx, learner):
    """Sharded data parallel: torch's FSDP2 for real, its per-block schedule in the simulator."""
    if ctx.mode == "real":
        yield from _delegated(ctx, learner)
        return
    sched = Schedule.build(ctx)
    fusion = FusionRound.build(ctx)
    role = RoleStep.build(ctx, sched.shard) if fusion is not None else None
    numel = sched.local_shard().numel()
    for step in range(ctx.start_step, ctx.steps):
        if role is None:
            yield from sched.step()
        else:  # a SAM agent runs the schedule twice
            yield from role.train(sched.step, numel)
        yield from sched.optimizer_dispatch()
        yield Compute(learner.optimizer_step, name="optimizer")
        if fusion is not None and fusion.due(step):
            yield from eval_forward(sched)  # each agent's held-out loss, its reliability
            fused = yield from fusion.run(sched.local_shard(), None)
            if role is not None:
                yield from role.after_fusion(fused, fusion.round(step))
        ctx.mark_boundary(step)
        yield StepDone(step, {})


def _delegated(ctx, learner):
    """One rank of a real run: FSDP2's hooks communicate inside ``forward_backward``."""
    if not learner.sharded:  # a plain replica would train alone, silently
        raise UserError("strategy fsdp runs a fully_shard learner (oresearcher.backends.fsdp.learner.make_learner); "
                         f"got {type(learner).__name__}")
    flops = learner.fwd_flops + learner.bwd_flops
    fusion = FusionRound.build(ctx)
    role = RoleStep.build(ctx, fusion.shard) if fusion is not None else None
    heldout = None if fusion is None else heldout_batch(ctx.scenario, fusion.shard.index(ctx.rank), ctx.device)
    guard = Guard.for_context(ctx)  # training.on_divergence (oresearcher.programs.divergence)
    for step in range(ctx.start_step, ctx.steps):
        if role is None:
            metrics = yield Compute(sharded_forward_backward, learner, flops=flops, name="fsdp_forward_backward")
        else:
            role.set_lr(learner, ctx.scenario.training.lr)  # the role's lr (dynamic roles change it)
            batch = yield Compute(next, learner.batches, name="batch")
            fixed = OnBatch(learner, batch)

            def one_pass():
                return (yield Compute(sharded_forward_backward, fixed, flops=flops, name="fsdp_forward_backward"))
            metrics = yield from role.train(one_pass, learner.numel, learner)
            metrics["role"] = role.code
        if not (yield from guard_sharded(ctx, guard, step, metrics)):
            yield Compute(learner.optimizer_step, name="optimizer")
        if fusion is not None and fusion.due(step):
            metrics["heldout_loss"] = yield Compute(heldout_loss, learner, heldout, flops=learner.fwd_flops,
                                                    name="heldout_forward")
            flat = yield Compute(learner.local_flat, name="pack")
            fused = yield from fusion.run(flat, metrics["heldout_loss"])
            if role is not None:
                fused = yield from role.after_fusion(fused, fusion.round(step))
                role.switch(fusion.losses, fusion.round(step))  # policy dynamic: the next step's roles
            yield Compute(learner.set_local_flat, fused, name="unpack")
        if ctx.should_eval(step):
            metrics.update((yield Compute(learner.evaluate, name="evaluate")))
        ctx.mark_boundary(step)
        yield StepDone(step, metrics)


class Schedule:
    """The ops of one FSDP step for one rank; payloads are meta tensors (sizes only)."""

    def __init__(self, plan, shard_group, replicate_group, reshard: bool, param_dtype, reduce_dtype,
                 streams: bool = True, costs: HostCosts | None = None):
        self.plan, self.reshard, self.streams = plan, reshard, streams
        self.shard, self.replicate = shard_group, replicate_group
        n = len(shard_group)
        # FSDP2's copies and DTensor dispatch (fsdp_costs.py); None: the collectives and FLOPs only
        self.costs = costs
        p, r = torch.empty((), dtype=param_dtype).element_size(), torch.empty((), dtype=reduce_dtype).element_size()
        self._copies = [(costs.gather_s(u.padded_numel(n), n, p, len(u.shapes)),
                         costs.reduce_s(u.padded_numel(n), n, p, r, len(u.shapes)))
                        if costs is not None else ((0.0, 0.0), (0.0, 0.0)) for u in plan.units]
        # this rank's shard of each unit (all-gather input) and each unit's unsharded
        # gradient (reduce-scatter input)
        self.shards = [torch.empty(u.padded_numel(n) // n, dtype=param_dtype, device="meta") for u in plan.units]
        self.grads = [torch.empty(u.padded_numel(n), dtype=reduce_dtype, device="meta") for u in plan.units]

    @classmethod
    def build(cls, ctx, costs: HostCosts | None = None) -> "Schedule":
        """The schedule of ``ctx``'s rank, priced at its scenario's device profile, or at
        ``costs`` (then without streams: a CPU rank's schedule, as calibrate prices it)."""
        sc = ctx.scenario
        size = sc.fsdp.group_size(ctx.world_size)
        shard, replicate = shard_groups(ctx.rank, ctx.world_size, size)
        if sc.fsdp.replicas == "fusion":  # independent agents: no gradient all-reduce across groups
            replicate = (ctx.rank,)
        compute = DTYPES[sc.workload.dtype]
        reduce = torch.float32 if sc.fsdp.reduce_dtype == "fp32" else compute
        if costs is not None:
            return cls(scenario_plan(sc), shard, replicate, sc.fsdp.reshard_after_forward, compute, reduce,
                       False, costs)
        device = getattr(ctx, "profile", None)  # the simulated device: streams, memory bandwidth, dispatch cost
        if device is None:
            raise ValueError("an fsdp schedule is priced at a device profile: the simulator sets AgentContext.profile")
        return cls(scenario_plan(sc), shard, replicate, sc.fsdp.reshard_after_forward, compute, reduce,
                   device.streams, HostCosts.of(device, sc.workload.dtype))

    def local_shard(self) -> torch.Tensor:
        """This rank's fp32 shard of every parameter, flat (meta): what a fusion round moves."""
        n = len(self.shard)
        return torch.empty(sum(u.padded_numel(n) // n for u in self.plan.units), dtype=torch.float32, device="meta")

    def _pass(self, flops: float) -> float:
        return flops if self.costs is None else self.costs.passes(flops)

    def _host(self, seconds: float, name: str):
        if seconds > 0:
            yield Compute(flops=self.costs.flops(seconds), name=name)

    def _gather(self, i):
        yield from self._host(self._copies[i][0][0], "fsdp_copy_in")
        return (yield AllGather(self.shards[i], group=self.shard, async_op=True, name="fsdp_all_gather"))

    def _hooks(self):
        """FSDP2's hooks of one unit in one step (fsdp_costs.py), with its forward."""
        if self.costs is not None:
            yield from self._host(self.costs.hooks_s(), "fsdp_hooks")

    def _unshard(self, i, handle):
        """Wait for unit i's all-gather, then copy it out into the unsharded parameters."""
        yield Wait(handle, name="fsdp_wait_gather")
        yield from self._host(self._copies[i][0][1], "fsdp_copy_out")

    def optimizer_dispatch(self):
        """The optimizer step on this rank's DTensor shards (fsdp_costs.py): their dispatch,
        and the step's work where the device's rate leaves it out."""
        if self.costs is not None:
            n = len(self.shard)
            seconds = self.costs.optimizer_s(sum(len(u.shapes) for u in self.plan.units),
                                             sum(u.padded_numel(n) // n for u in self.plan.units))
            yield from self._host(seconds, "fsdp_sharded_optimizer")

    def step(self):
        """Forward then backward of one step; returns when every gradient is reduced."""
        if not self.streams:
            yield from self.blocking_step()
        else:
            yield from self.forward()
            yield from self.backward()

    def blocking_step(self):
        """FSDP2 on a device without streams (CPU ranks): each all-gather runs in the unit's
        pre-forward/pre-backward hook and the rank waits for it; each reduce-scatter runs in
        the post-backward hook and the rank waits for it (and for the HSDP all-reduce after
        it). No prefetch, no overlap: communication and compute take turns."""
        blocks = self.plan.blocks
        nb = len(blocks)
        yield from self._unshard(0, (yield from self._gather(0)))  # root
        yield from self._hooks()
        for i in range(1, nb + 1):
            yield from self._unshard(i, (yield from self._gather(i)))
            yield from self._hooks()
            yield Compute(flops=self._pass(blocks[i - 1].fwd_flops), name="forward")
        yield Compute(flops=self._pass(self.plan.root.fwd_flops), name="forward")
        yield Compute(flops=self._pass(self.plan.root.bwd_flops), name="backward")
        for i in range(nb, 0, -1):
            if self.reshard and i < nb:  # the last block kept its parameters after forward
                yield from self._unshard(i, (yield from self._gather(i)))
            yield Compute(flops=self._pass(blocks[i - 1].bwd_flops), name="backward")
            yield from self._blocking_reduce(i)
        yield from self._blocking_reduce(0)  # root: embedding gradients come last

    def _blocking_reduce(self, i):
        before, after = self._copies[i][1]
        yield from self._host(before, "fsdp_rs_copy_in")
        shard = yield ReduceScatter(self.grads[i], group=self.shard, op="avg", name="fsdp_reduce_scatter")
        if len(self.replicate) > 1:
            yield AllReduce(shard, group=self.replicate, op="avg", name="hsdp_all_reduce")
        yield from self._host(after, "fsdp_rs_accumulate")

    def forward(self):
        blocks = self.plan.blocks
        nb = len(blocks)
        root = yield from self._gather(0)
        ahead = (yield from self._gather(1)) if nb else None
        yield from self._unshard(0, root)
        for i in range(1, nb + 1):
            yield from self._unshard(i, ahead)
            ahead = (yield from self._gather(i + 1)) if i < nb else None
            yield Compute(flops=self._pass(blocks[i - 1].fwd_flops), name="forward")
        yield Compute(flops=self._pass(self.plan.root.fwd_flops), name="forward")

    def backward(self):
        blocks = self.plan.blocks
        nb = len(blocks)
        yield Compute(flops=self._pass(self.plan.root.bwd_flops), name="backward")  # LM head (root stays gathered)
        pending, reduces = None, []
        gather = None  # block nb (the last) was not resharded after its forward
        for i in range(nb, 0, -1):
            if gather is not None:
                yield from self._unshard(i, gather)
            gather = (yield from self._gather(i - 1)) if self.reshard and i > 1 else None
            yield Compute(flops=self._pass(blocks[i - 1].bwd_flops), name="backward")
            pending = yield from self._reduce(i, pending, reduces)
        pending = yield from self._reduce(0, pending, reduces)  # root: embedding grads come last
        yield from self._replicate(pending, reduces)
        for h in reduces:
            yield Wait(h, name="fsdp_wait_reduce")

    def _reduce(self, i, pending, reduces):
        """Issue unit i's reduce-scatter; the previous one's replicate all-reduce follows it."""
        yield from self._host(self._copies[i][1][0], "fsdp_rs_copy_in")  # on the compute stream
        h = yield ReduceScatter(self.grads[i], group=self.shard, op="avg", async_op=True,
                                name="fsdp_reduce_scatter")
        yield from self._replicate(pending, reduces)
        return h

    def _replicate(self, pending, reduces):
        if pending is None:
            return
        if len(self.replicate) == 1:
            reduces.append(pending)
            return
        shard = yield Wait(pending, name="fsdp_wait_reduce")
        reduces.append((yield AllReduce(shard, group=self.replicate, op="avg", async_op=True,
                                        name="hsdp_all_reduce")))


class FusionRound:
    """Shard-wise fusion of sharded agents (``fsdp.replicas: fusion``), as ops."""

    def __init__(self, rank: int, world_size: int, size: int, interval: int, fusion_spec):
        self.shard, self.replicate = shard_groups(rank, world_size, size)
        self.agent, self.interval = rank // size, interval
        self.losses = None  # the agents' held-out losses of the last round (real runs)
        self.options = dict(method=fusion_spec.method, temperature=fusion_spec.temperature,
                            similarity_weight=fusion_spec.similarity_weight)

    @classmethod
    def build(cls, ctx):
        sc = ctx.scenario
        if sc.fsdp.replicas != "fusion":
            return None
        return cls(ctx.rank, ctx.world_size, sc.fsdp.group_size(ctx.world_size), sc.communication.interval,
                   sc.cooperation.fusion)

    def due(self, step: int) -> bool:
        return (step + 1) % self.interval == 0

    def round(self, step: int) -> int:
        """The number of the round ``step`` ends (1, 2, ...)."""
        return (step + 1) // self.interval

    def run(self, flat: torch.Tensor, loss):
        """Fuse this rank's flat shard; ``loss``: its held-out loss (None in shape mode)."""
        meta = flat.device.type == "meta"
        mine = torch.tensor([float("nan") if loss is None else loss], dtype=torch.float64,
                            device="meta" if meta else "cpu")
        agent_loss = yield AllReduce(mine, group=self.shard, op="avg", name="fusion_loss")
        losses = yield AllGather(agent_loss, group=self.replicate, name="fusion_losses")
        if meta:
            rel = excluded = None
        else:
            lo = self.losses = torch.cat(losses)
            excluded = ~torch.isfinite(lo)
            rel = torch.exp(-torch.nan_to_num(lo, nan=0.0, posinf=0.0))
        return (yield from fuse_sharded(flat, self.agent, rel, excluded, shard_group=self.shard,
                                        replicate_group=self.replicate, **self.options))
