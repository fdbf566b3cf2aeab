"""The mechanisms of the cooperative round's local steps: gradient sharing with privacy
and overhead control, and the shared replay pool. Each is a thin shell that turns its
:mod:`oresearcher.cooperation` module's decisions into ops at the
:class:`~oresearcher.programs.cooperative_round.Round`'s hooks; the round builds one only
where the scenario turns it on (:data:`~oresearcher.programs.cooperative_round.MECHANISMS`).
"""
from __future__ import annotations

import logging

import torch

from ..cooperation import privacy as P
from ..cooperation import replay_sharing as RS
from ..cooperation.budget_round import BudgetRun
from ..cooperation.replay import PrioritizedReplay
from ..models.workloads import per_rank_batch
from ..ops import AllReduce, Compute
from .data_parallel import reduce_buckets

log = logging.getLogger(__name__)


class Privacy:
    """``cooperation.privacy``: every local step's gradient is DP-SGD's, noised by the agent
    before any codec sees it (:mod:`oresearcher.cooperation.privacy`). q = its batch / its
    private data (the task's training split unless ``privacy.dataset_size`` says otherwise)."""

    def __init__(self, ctx, learner):
        sc = ctx.scenario
        batch = getattr(getattr(learner, "batches", None), "batch", None) or per_rank_batch(sc)
        size = sc.cooperation.privacy.dataset_size or learner.train_size or batch
        self.learner = learner
        self.state = ctx.register("privacy", P.from_scenario(sc, ctx.rank, batch, size))

    def gradient_op(self, flops: float) -> Compute:
        """Hook ``gradient``: the step's forward-backward, private."""
        L = self.learner
        return Compute(P.private_forward_backward, L, self.state, name="dp_fwd_bwd",
                       flops=P.private_step_flops(flops, self.state.batch, L.numel))

    def metrics(self) -> dict:
        """Hook ``after_round``: epsilon per agent at the scenario's delta (report and TensorBoard)."""
        return {"epsilon": self.state.epsilon(), "noise_multiplier": self.state.sigma}


class GradientSharing:
    """``communication.gradient_sharing``: agents of one architecture average gradients
    every ``share_every`` steps, for as many steps as every member takes this round (so the
    collectives pair up), through ``communication.codec``; under ``communication.budget``
    the overhead controller (:mod:`oresearcher.cooperation.budget_round`) picks the steps
    and the codec and times the shares. A diverged agent shares zeros and is left out of
    the average (:func:`finite_buckets`, :func:`healthy_average`)."""

    def __init__(self, ctx, share_group, members, unit_costs):
        sc = ctx.scenario.communication
        self.ctx, self.group = ctx, share_group
        self.on = sc.gradient_sharing and len(members) > 1
        self.every = sc.share_every
        self.codec = ctx.codec  # built (and registered) once per agent
        self.overhead = BudgetRun(ctx, unit_costs) if sc.budget is not None else None
        self.shared_steps = 0

    def begin(self, steps_now, members) -> None:
        """Hook ``begin``: this round's shared steps (and the controller's plan)."""
        self.shared_steps = min(max(1, steps_now[i]) for i in members)
        if self.overhead is not None:
            self.overhead.plan(steps_now, members)

    def plan_step(self, s: int):
        """(share at local step ``s``?, the codec). The controller's codec is read every step:
        its rung's codec is built and registered when first read."""
        if self.overhead is None:
            return self.on and s < self.shared_steps and s % self.every == 0, self.codec
        return self.on and self.overhead.share_at(s), self.overhead.codec

    def exchange(self, learner, codec):
        """Hook ``share``: the healthy members' average gradient (generator of ops)."""
        timer = self.overhead.timer if self.overhead is not None else None
        if timer is not None:  # communication.budget: time blocked at the share
            timer.begin_share()
        buckets = yield Compute(finite_buckets, learner, name="pack")
        reduced = yield from healthy_average(self.ctx, buckets, self.group, codec)
        if timer is not None:
            timer.end_share()
        return reduced

    def local_done(self) -> None:
        """Hook ``local_done``: the controller's clock at the end of the local steps."""
        if self.overhead is not None:
            self.overhead.timer.local_done()

    def after_round(self, rnd: int, my_steps: int, last: bool):
        """Hook ``after_round``: the controller gathers the round's timings and decides the
        next round (not after the last); its metrics."""
        if self.overhead is None or last:
            return {}
        self.overhead.timer.sync_done()
        return (yield from self.overhead.end_round(rnd, my_steps))


class Replay:
    """``cooperation.replay``: this agent's replica of the shared prioritized pool, synced by
    one AllGather every ``sync_every`` steps (as many as every agent takes)
    (:mod:`oresearcher.cooperation.replay_sharing`); Ape-X epsilons by role."""

    def __init__(self, ctx, learner):
        sc, c = ctx.scenario, ctx.scenario.cooperation.replay
        self.learner, self.rank, self.cfg = learner, ctx.rank, c
        batch = getattr(getattr(learner, "batches", None), "batch", 1)
        spec = learner.replay_spec or {}
        pool = PrioritizedReplay(c.capacity, c.alpha, c.beta_start, beta_steps=sc.training.steps)
        self.shared = ctx.register("replay", RS.SharedReplay(pool, spec, ctx.rank, c.quota, c.sync_every * batch))
        if learner.use_shared_replay is not None:
            learner.use_shared_replay(self.shared)
        self.world_steps = 0

    def begin(self, steps_now, roles) -> None:
        """Hook ``begin``: every agent takes part in this round's first ``world_steps`` syncs."""
        self.world_steps = min(max(1, x) for x in steps_now)
        if self.cfg.apex_epsilon and self.learner.set_fixed_epsilon is not None:
            self.learner.set_fixed_epsilon(RS.apex_epsilons(roles)[self.rank])

    def after_step(self, s: int):
        """Hook ``after_step``: the pool's sync, when due (generator of ops)."""
        if s < self.world_steps and (s + 1) % self.cfg.sync_every == 0:
            yield from RS.share(self.shared, self.shared.message_numel)


def finite_buckets(learner) -> list:
    """The gradient buckets, zeroed if any value is non-finite: a diverged agent must not
    poison the others through gradient sharing (fusion excludes it at the round's end).
    The last bucket carries one more element, 1 if this agent's gradient is healthy, so
    the average divides by the healthy agents, not all of them (:func:`healthy_average`)."""
    buckets = learner.grad_buckets()
    healthy = 1.0
    if buckets and buckets[0].device.type != "meta" and not all(bool(torch.isfinite(b).all()) for b in buckets):
        log.warning("non-finite gradients: this agent shares zeros until the fusion round")
        buckets, healthy = [torch.zeros_like(b) for b in buckets], 0.0
    if buckets:
        last = buckets[-1]
        buckets[-1] = torch.cat([last.reshape(-1), torch.full((1,), healthy, dtype=last.dtype, device=last.device)])
    return buckets


def healthy_average(ctx, buckets, group, codec):
    """Average gradients over the healthy members of ``group`` only: sum / healthy count,
    the count being the sum of the members' flags (the last bucket's extra element).
    With a codec the flags travel in their own exact all-reduce (a compressed element
    would not count exactly)."""
    if not buckets:
        return []
    if codec is None:
        reduced = yield from reduce_buckets(ctx, buckets, group, None, name="grad_share")
        frac = reduced[-1][-1:]  # mean of the flags: healthy / members
        reduced[-1] = reduced[-1][:-1]
    else:
        flags = buckets[-1][-1:].clone()
        buckets = buckets[:-1] + [buckets[-1][:-1]]
        reduced = yield from reduce_buckets(ctx, buckets, group, codec, name="grad_share")
        frac = yield AllReduce(flags, group=group, op="avg", name="healthy_count")
    if frac.device.type == "meta":
        return reduced
    f = float(frac.reshape(-1)[0])
    return [b / f for b in reduced] if f > 0 else reduced
