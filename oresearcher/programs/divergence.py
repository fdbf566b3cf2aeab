"""Divergence: a non-finite loss, gradient or parameter on a rank, caught before it is shared.

Without a guard one rank's NaN reaches every agent at the next all-reduce or average
(the mean of anything and NaN is NaN). Every program checks what it is about to share,
inside the Compute op that produces it (no extra op, so timings do not move), and acts
on ``training.on_divergence``:

- ``stop``: the rank raises :class:`Diverged` before the value leaves it: one line
  naming the rank, the step and what was non-finite; exit code 2.
- ``skip``: the rank's contribution is left out and the rank is restored from its last
  good state. ``ddp``: the rank shares zeros, a one-float ``divergence_check``
  all-reduce counts the healthy ranks and the average is taken over them (its parameters
  and optimizer state were not touched yet, so the healthy average *is* its restore).
  ``local_sgd``/``diloco``/``single``: the rank restores the learner (parameters and
  optimizer state) saved at the last average and sits out the rest of the averaging
  period; at the average it shares zeros and the average is over the healthy ranks.
  The cooperative program keeps its own isolation (it shares zeros until the fusion
  round, fusion gives it weight 0 and hands it the healthy agents' parameters).
  ``fsdp`` (real runs): FSDP2 reduce-scatters inside backward, so the check sits in the
  reduce-scatter itself (:mod:`oresearcher.backends.fsdp.guard`): a rank's non-finite
  gradients are zeroed before they leave it. Once reduced, one rank's share of a
  sharded gradient cannot be taken out again, so under ``skip`` the step's optimizer
  step is skipped on every rank (parameters and optimizer state stay the last good
  ones; the data stream moves on).
- When every agent is out at once, the run stops with :class:`AllExcluded`, one line
  that says when, why and what to change.

Default: ``skip`` for the cooperative program (``oresearcher``), ``stop`` for the others.
Shape mode holds no values, so nothing is ever found there.
"""
from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass

import torch

from ..errors import UserError
from ..models.sharding import local_part
from ..ops import AllReduce, Compute

log = logging.getLogger(__name__)

POLICIES = ("stop", "skip")


class Diverged(UserError):
    """A rank found a non-finite value before sharing it (policy stop)."""


class AllExcluded(UserError):
    """Every agent diverged or was excluded at the same point: nothing healthy is left."""


def policy(scenario) -> str:
    """``training.on_divergence``, or the strategy's default when unset."""
    chosen = scenario.training.on_divergence
    if chosen is not None:
        return chosen
    return scenario.strategy.on_divergence


def non_finite(tensors) -> bool:
    """Does any of ``tensors`` hold a NaN or an infinity? Meta tensors hold nothing.

    amax and amin propagate NaN and catch +inf and -inf (read-only reductions, cheaper
    than ``isfinite(x).all()``); one host sync for all of them.
    """
    ends = [f(t) for t in tensors if t is not None and t.numel() and t.device.type != "meta"
            for f in (torch.amax, torch.amin)]
    if not ends:
        return False
    return not bool(torch.isfinite(torch.stack([e.float() for e in ends])).all())


def find(loss=None, grads=(), params=()) -> str | None:
    """What is non-finite, in the order it appears: "loss", "gradient", "parameters"."""
    if loss is not None and not math.isfinite(float(loss)):
        return "loss"
    if non_finite(grads):
        return "gradient"
    if non_finite(params):
        return "parameters"
    return None


def learner_grads(learner) -> list:
    return [p.grad for p in learner.params if p.grad is not None]


SKIP_REPLICA = "'skip' leaves the rank out and restores it"
SKIP_SHARDED = "'skip' drops the step on every rank"  # fsdp: a reduced shard cannot be taken back


def diverged_message(rank: int, step: int, what: str, lr: float, skip: str = SKIP_REPLICA) -> str:
    return (f"rank {rank} diverged at step {step}: non-finite {what} (training.lr={lr:g}); stopped before it "
            f"was shared (training.on_divergence: stop; {skip})")


def excluded_message(where: str, world: int, why: str, lr: float, skipped: int | None = None) -> str:
    past = f"; {skipped} contributions skipped before" if skipped else ""
    return (f"every agent is excluded at {where}: all {world} {why}{past}; nothing healthy is left to "
            f"train from (training.lr={lr:g}: lower it, or resume from an earlier checkpoint)")


@dataclass
class Guard:
    """One rank's divergence state: the policy, counters, and (skip) its last good state.

    The snapshot is an in-memory copy of the learner's state (parameters and optimizer
    state: twice the memory of the model under ``skip``); checkpoints carry the counters.
    """

    rank: int
    world_size: int
    policy: str = "stop"
    lr: float = 0.0
    skipped: int = 0  # contributions this rank left out
    out: bool = False  # diverged since the last average (local_sgd family): sits out
    _snapshot: dict | None = None

    @classmethod
    def for_context(cls, ctx) -> "Guard":
        g = cls(ctx.rank, ctx.world_size, policy(ctx.scenario), float(ctx.scenario.training.lr))
        return ctx.register("divergence", g)

    def state_dict(self) -> dict:
        return {"skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = int(state.get("skipped", 0))

    # -- checks, run inside the Compute that produces the value -----------------------
    def forward_backward(self, learner) -> dict:
        """``learner.forward_backward()`` plus the check; "_nonfinite" says what was bad."""
        metrics = dict(learner.forward_backward() or {})
        what = find(metrics.get("loss"), learner_grads(learner))
        if what:
            metrics["_nonfinite"] = what
        return metrics

    def raise_if_stop(self, step: int, what: str | None, skip: str = SKIP_REPLICA) -> None:
        if what and self.policy == "stop":
            raise Diverged(diverged_message(self.rank, step, what, self.lr, skip))

    # -- skip: snapshots and the healthy count ----------------------------------------
    def snapshot(self, learner) -> None:
        """Keep the learner's state as the last good one (unless it is not finite)."""
        if self.policy == "skip" and learner.restorable and not non_finite(learner.params):
            self._snapshot = copy.deepcopy(learner.state_dict())

    def restore(self, learner) -> None:
        if self._snapshot is not None:
            learner.load_state_dict(copy.deepcopy(self._snapshot))

    def healthy_count(self, ctx, bad: bool, step: int, why: str, skipped: str = "its contribution is skipped"):
        """Generator: all-reduce how many ranks are healthy; returns n / healthy, the
        factor that turns an average over all ranks (zeros from the bad ones) into the
        average over the healthy ones. Raises AllExcluded when none is."""
        dev = ctx.device if ctx.numeric else torch.device("meta")
        flag = torch.tensor([0.0 if bad else 1.0], device=dev) if dev.type != "meta" else torch.empty(1, device=dev)
        total = yield AllReduce(flag, group=ctx.group, op="sum", name="divergence_check")
        if total.device.type == "meta":
            return 1.0
        healthy = int(round(float(total.item())))
        members = len(ctx.group) if ctx.group else ctx.world_size
        if healthy == 0:
            raise AllExcluded(excluded_message(f"step {step}", members, why, self.lr, self.skipped or None))
        if bad:
            self.skipped += 1
            log.warning("rank %d: non-finite values at step %d; %s (%d of %d ranks healthy)",
                        self.rank, step, skipped, healthy, members)
        return members / healthy


def guard_buckets(ctx, guard: Guard, step: int, metrics: dict, buckets: list):
    """Generator for ``ddp``: check before the gradient buckets are shared.

    Returns (buckets to share, scale for the averaged result). ``metrics`` comes from
    :meth:`Guard.forward_backward`; its "_nonfinite" key is consumed here.
    """
    what = metrics.pop("_nonfinite", None)
    guard.raise_if_stop(step, what)
    if guard.policy != "skip":
        return buckets, 1.0
    scale = yield from guard.healthy_count(ctx, bool(what), step, "ranks had non-finite gradients")
    if what:
        metrics["diverged"] = 1.0
        buckets = [torch.zeros_like(b) for b in buckets]
    return buckets, scale


def guard_average(ctx, guard: Guard, step: int, flat):
    """Generator for the local_sgd family: before the parameters are averaged.

    A rank that diverged in this period (``guard.out``) or whose parameters are
    non-finite shares zeros; returns (flat to share, scale of the average).
    """
    bad = guard.out or find(params=[flat]) is not None
    if bad and not guard.out:
        guard.raise_if_stop(step, "parameters")
    if guard.policy != "skip":
        return flat, 1.0
    scale = yield from guard.healthy_count(ctx, bad, step, "ranks diverged since the last average")
    guard.out = False
    return (torch.zeros_like(flat) if bad else flat), scale


def guard_local(ctx, guard: Guard, step: int, metrics: dict, learner):
    """Generator for a local step after forward+backward: returns True when the
    optimizer step must be skipped (the rank restored its last good state and sits out
    until the next average)."""
    what = metrics.pop("_nonfinite", None)
    guard.raise_if_stop(step, what)
    if not what:
        return False
    guard.out = True
    metrics["diverged"] = 1.0
    log.warning("rank %d: non-finite %s at step %d; restored the last good state, sitting out until the "
                "next average", guard.rank, what, step)
    yield Compute(guard.restore, learner, name="restore")
    return True


def sharded_forward_backward(learner) -> dict:
    """``fsdp`` (real): forward+backward of an FSDP2 learner and the check, inside its
    Compute. What its checked reduce-scatter found in this rank's gradients before they
    were shared, its loss, and (for shard groups of one, where nothing is reduced) its
    local gradient shards; "_nonfinite" says what was bad."""
    metrics = dict(learner.forward_backward() or {})
    check = learner.reduce_check
    found = check.take() if check is not None else False
    local = [local_part(g) for g in learner_grads(learner)]
    what = find(metrics.get("loss")) or ("gradient" if found or non_finite(local) else None)
    if what:
        metrics["_nonfinite"] = what
    return metrics


def guard_sharded(ctx, guard: Guard, step: int, metrics: dict):
    """Generator for ``fsdp`` (real): after forward+backward, before the optimizer step.
    Returns True when the optimizer step is skipped on every rank (policy skip, some rank
    non-finite); raises Diverged (stop) or AllExcluded (every rank)."""
    what = metrics.pop("_nonfinite", None)
    guard.raise_if_stop(step, what, SKIP_SHARDED)
    if guard.policy != "skip":
        return False
    scale = yield from guard.healthy_count(ctx, bool(what), step, "ranks had non-finite gradients",
                                           skipped="the step is skipped on every rank (fsdp)")
    if what:
        metrics["diverged"] = 1.0
    return scale != 1.0
