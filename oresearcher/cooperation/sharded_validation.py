"""Held-out reliability of sharded agents: each agent scored by its own ranks on a disjoint
split of one validation set (``fsdp.replicas: fusion``).

The unsharded program's validators score every agent on held-out data
(:mod:`oresearcher.cooperation.validation`). A sharded agent cannot be scored by another
agent's ranks without gathering its whole model, so it scores itself, before each fusion
round, on the same held-out set as every other agent: rank s of each agent evaluates
held-out batch s (disjoint across the agent's ranks, together the agent's set), and the
agent's loss is their mean (the round's all-reduce over the shard group). The round's
reliability is exp(-that loss), of the parameters being fused (after the step), not of
the step's training batch.

The held-out batches come from the task's own token stream (the same Markov chain, the
same permutation) under stream numbers no training rank uses (``MAX_WORLD + s``); they are
drawn afresh from their seed at every round, so they are the same set each round, cost no
state and resume exactly. One batch per rank, the size of its training batch.
"""
from __future__ import annotations

import torch

from ..ops import AllGather, Compute, Wait
from ..scenario.types import MAX_WORLD


def heldout_batch(scenario, shard_index: int, device="cpu") -> torch.Tensor:
    """Held-out batch ``shard_index`` of the scenario's validation set (LongTensor[b, seq + 1])."""
    from ..models import PRESETS
    from ..models.workloads import per_rank_batch
    from ..tasks.synthetic_lm import TokenStream

    w = scenario.workload
    return next(TokenStream(PRESETS[w.model].vocab_size, per_rank_batch(scenario), w.seq_len, scenario.seed,
                            MAX_WORLD + shard_index, device=device))


@torch.no_grad()
def heldout_loss(learner, batch: torch.Tensor) -> float:
    """The loss of ``learner``'s (sharded) model on ``batch``; its units resharded after."""
    from torch.distributed.fsdp import FSDPModule

    module = learner.module
    module.eval()
    try:
        loss = float(learner.loss_fn(module, batch))
    finally:
        module.train()
        # FSDP2 keeps the root (and a unit not resharded after forward) gathered after a
        # forward, expecting backward; without one, put the sharded parameters back
        for m in module.modules():
            if isinstance(m, FSDPModule):
                m.reshard()
    return loss


def eval_forward(sched):
    """The simulator's ops of that forward on one rank (FLOPs of the training forward: the
    batch is as large). With streams, FSDP2's forward with prefetch (Schedule.forward);
    without (CPU ranks), each unit's all-gather waited for, then its forward; FSDP2's host
    copies (oresearcher.programs.fsdp_costs) are not charged here."""
    if sched.streams:
        yield from sched.forward()
        return
    plan = sched.plan
    for i, unit in enumerate(plan.units):  # the root first, then the blocks
        yield Wait((yield AllGather(sched.shards[i], group=sched.shard, async_op=True, name="fsdp_all_gather")),
                   name="fsdp_wait_gather")
        if i:
            yield Compute(flops=unit.fwd_flops, name="heldout_forward")
    yield Compute(flops=plan.root.fwd_flops, name="heldout_forward")
