"""Baseline programs: synchronous data parallel, local SGD and DiLoCo.

Each is a generator ``program(ctx, learner)`` yielding ops (see :mod:`oresearcher.ops`).

- ``ddp``: all-reduce (average) the gradient buckets every step. With ``overlap`` the
  backward pass is charged bucket by bucket and each bucket's all-reduce starts as soon
  as its gradients exist, as torch DDP does; the numeric math of the whole backward runs
  in the first Compute, so overlap changes timing only, never values.
- ``local_sgd``: each agent steps alone and the group averages parameters every H steps
  (Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019).
- ``diloco``: local_sgd plus an outer Nesterov step on the pseudo-gradient
  (Douillard et al., 2023).

Every step is a resume boundary (``ctx.mark_boundary``): between steps these programs
carry only the learner, the codec (``ddp``) and DiLoCo's outer optimizer (registered as
"outer"), so a resumed run from ``ctx.start_step`` continues bit-identically.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..codecs.collectives import two_phase_allreduce
from .divergence import Guard, guard_average, guard_buckets, guard_local
from ..ops import AllReduce, Compute, Program, StepDone, Wait
from ..cooperation.outer import OuterNesterov

if TYPE_CHECKING:
    from . import AgentContext
    from ..models.learner import Learner


def _backward_shares(learner, buckets):
    total = sum(b.numel() for b in buckets) or 1
    return [learner.bwd_flops * b.numel() / total for b in buckets]


def allreduce_grads(ctx, learner, overlap: bool, guard: Guard | None = None, step: int = 0):
    """Yield one step's forward, bucketed backward and gradient all-reduce.

    Returns (metrics, averaged buckets). Used by ``ddp`` and by cooperative programs.
    With a codec (``communication.codec``) each bucket goes through the two-phase
    compressed all-reduce after backward; compressed exchanges are blocking sequences
    of ops, so they do not overlap backward. With a ``guard``
    (:mod:`oresearcher.programs.divergence`) the loss and gradients are checked before sharing.
    """
    fwd_bwd = learner.forward_backward if guard is None else (lambda: guard.forward_backward(learner))
    metrics = yield Compute(fwd_bwd, flops=learner.fwd_flops, name="forward")
    buckets = yield Compute(learner.grad_buckets, name="pack")
    scale = 1.0
    if guard is not None:
        buckets, scale = yield from guard_buckets(ctx, guard, step, metrics, buckets)
    reduced = yield from _share(ctx, learner, buckets, overlap)
    if scale != 1.0:  # some ranks shared zeros: the average over the healthy ones
        reduced = [b * scale for b in reduced]
    return metrics, reduced


def reduce_buckets(ctx, buckets, group, codec, name: str = "grad_bucket"):
    """Average ``buckets`` over ``group``, one after the other: an all-reduce each, or with a
    ``codec`` its two-phase compressed all-reduce (each rank's codec state, error feedback,
    keyed per bucket; two-phase keeps the codec's saving where an all-gather of payloads
    would not). The one bucket loop of every program that shares gradients."""
    reduced = []
    for i, b in enumerate(buckets):
        if codec is None:
            reduced.append((yield AllReduce(b, group=group, op="avg", name=name)))
        else:
            reduced.append((yield from two_phase_allreduce(codec, b, rank=ctx.rank, group=group,
                                                           world_size=ctx.world_size, key=f"grad{i}", average=True)))
    return reduced


def _share(ctx, learner, buckets, overlap: bool):
    """The backward compute and the gradient all-reduces of ``buckets``; returns them averaged."""
    shares = _backward_shares(learner, buckets)
    if ctx.codec is not None or not overlap:  # compressed exchanges are blocking sequences of ops
        yield Compute(flops=sum(shares), name="backward")
        return (yield from reduce_buckets(ctx, buckets, ctx.group, ctx.codec))
    handles = []
    for b, f in zip(buckets, shares):  # each bucket's all-reduce overlaps the rest of backward
        yield Compute(flops=f, name="backward")
        handles.append((yield AllReduce(b, group=ctx.group, op="avg", async_op=True, name="grad_bucket")))
    reduced = []
    for h in handles:
        reduced.append((yield Wait(h)))
    return reduced


def ddp(ctx: AgentContext, learner: Learner) -> Program:
    """Synchronous data parallel: every step, average gradients across the group."""
    overlap = ctx.scenario.communication.overlap
    guard = Guard.for_context(ctx)
    for step in range(ctx.start_step, ctx.steps):
        metrics, reduced = yield from allreduce_grads(ctx, learner, overlap, guard, step)
        yield Compute(learner.apply_grads, reduced, name="optimizer")
        if ctx.should_eval(step):
            metrics.update((yield Compute(learner.evaluate, name="evaluate")))
        ctx.mark_boundary(step)
        yield StepDone(step, metrics)


def local_step(learner, ctx=None, guard: Guard | None = None, step: int = 0):
    """One purely local training step: forward+backward then optimizer. With a ``guard``
    a non-finite loss or gradient stops the run or restores the last good state
    (:func:`oresearcher.programs.divergence.guard_local`) instead of stepping."""
    fwd_bwd = learner.forward_backward if guard is None else (lambda: guard.forward_backward(learner))
    metrics = yield Compute(fwd_bwd, flops=learner.fwd_flops + learner.bwd_flops, name="fwd_bwd")
    if guard is not None and (yield from guard_local(ctx, guard, step, metrics, learner)):
        return metrics
    yield Compute(learner.optimizer_step, name="optimizer")
    return metrics


def average_params(ctx, learner, outer: OuterNesterov | None = None, guard: Guard | None = None, step: int = 0):
    """All-reduce-average the flat parameters; with ``outer`` apply DiLoCo's outer step.
    With a ``guard`` diverged ranks are left out of the average (policy skip)."""
    flat = yield Compute(learner.flat_params, name="pack")
    scale = 1.0
    if guard is not None:
        flat, scale = yield from guard_average(ctx, guard, step, flat)
    avg = yield AllReduce(flat, group=ctx.group, op="avg", name="param_average")
    if scale != 1.0:
        avg = avg * scale
    if outer is not None:
        avg = yield Compute(outer.step, avg, name="outer_step")
    yield Compute(learner.set_flat_params, avg, name="unpack")
    return avg


def _periodic(ctx, learner, outer):
    H = ctx.scenario.training.local_steps
    if outer is not None:
        ctx.register("outer", outer).to(ctx.device)  # a checkpoint loads on the CPU
        if outer.anchor is None:  # a fresh run (or a checkpoint of another strategy)
            outer.set_anchor((yield Compute(learner.flat_params, name="pack")))
    guard = Guard.for_context(ctx)
    if guard.policy == "skip":
        yield Compute(guard.snapshot, learner, name="snapshot")
    for step in range(ctx.start_step, ctx.steps):
        if guard.out:  # diverged and restored: sits out until the average
            metrics = {"diverged": 1.0}
        else:
            metrics = yield from local_step(learner, ctx, guard, step)
        if (step + 1) % H == 0 and ctx.world_size > 1:
            yield from average_params(ctx, learner, outer, guard, step)
        if ctx.world_size == 1:
            guard.out = False  # alone: no average to wait for; it goes on from the restored state
        if (step + 1) % H == 0 and guard.policy == "skip":  # the last good state
            yield Compute(guard.snapshot, learner, name="snapshot")
        if ctx.should_eval(step):
            metrics.update((yield Compute(learner.evaluate, name="evaluate")))
        ctx.mark_boundary(step)
        yield StepDone(step, metrics)


def local_sgd(ctx: AgentContext, learner: Learner) -> Program:
    """Average parameters every ``training.local_steps`` steps."""
    yield from _periodic(ctx, learner, None)


def diloco(ctx: AgentContext, learner: Learner) -> Program:
    """Local SGD with an outer Nesterov step (lr 0.7, momentum 0.9) at each average."""
    yield from _periodic(ctx, learner, OuterNesterov())


def single(ctx: AgentContext, learner: Learner) -> Program:
    """One agent alone: local steps, no communication (the equal-compute baseline).
    Policy skip: a diverged step is dropped and the agent goes on from its last good
    state (saved every ``training.local_steps`` steps)."""
    guard = Guard.for_context(ctx)
    H = ctx.scenario.training.local_steps
    for step in range(ctx.start_step, ctx.steps):
        if guard.policy == "skip" and (step - ctx.start_step) % H == 0:
            yield Compute(guard.snapshot, learner, name="snapshot")
        metrics = yield from local_step(learner, ctx, guard, step)
        guard.out = False  # alone: nobody to wait for
        if ctx.should_eval(step):
            metrics.update((yield Compute(learner.evaluate, name="evaluate")))
        ctx.mark_boundary(step)
        yield StepDone(step, metrics)
