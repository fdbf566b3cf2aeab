"""The cooperative round as one object: a pipeline of mechanisms, one hook each.

:class:`Round` holds one agent's mechanisms and runs its rounds; what a round does is
read top to bottom in :meth:`Round.run_round`, :meth:`Round.local_steps` and
:meth:`Round.end`::

    begin         roles (lr, knobs) . rewards (peer term) . replay (Ape-X eps) . sharing (plan)
    local steps   gradient   privacy (DP-SGD) | roles (SAM) | plain
                  guard      training.on_divergence: stop
                  share      gradient sharing (codec; overhead control picks steps, codec)
                  after_step replay (pool sync) . roles (SWA)
    end           before_gather roles (SWA average in)
                  exchange   parameters and validators' scores gathered
                  score      rewards (scheduled weights, peers' snapshot)
                  fuse       fusion (attention weights) . roles decide (PBT, switches)
                             . fusion (fuse, outer Nesterov) . roles (explorer noise, exploit)
                  ensemble   the outputs' ensemble refitted
                  allocate   allocation (next round's steps)
    after_round   overhead control (gather timings, decide) . privacy (epsilon)
    final         the last round: agents scored for distillation (programs/distill.py)

A mechanism the scenario turns off is not built (its attribute is None) and its hooks
are skipped; a swapped one (fusion.method, roles.policy, allocation.enabled) is the same
object with another setting. :data:`MECHANISMS` names each mechanism's module, hooks
and switches: the ablation (:mod:`oresearcher.experiments.ablation`) turns mechanisms
off and on through those switches only, never by another code path.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from . import divergence as D
from .cooperative_exchange import LoopState, arch_group, arch_ids, gather_params, round_lengths, round_rewards, validate
from .cooperative_group import Allocation, Ensemble, Fusion, Rewards, Roles, all_excluded, arch_numel, current_lr
from .cooperative_local import GradientSharing, Privacy, Replay
from ..cooperation import roles as R
from ..ops import Compute, StepDone

log = logging.getLogger("oresearcher.programs.cooperative")


@dataclass(frozen=True)
class Mechanism:
    """One mechanism of the round: where its math lives, the hooks it acts in, and the
    scenario fields that switch it (turn it off, or swap it for its plain counterpart)."""

    name: str
    module: str
    hooks: tuple
    switches: tuple = field(default_factory=tuple)


MECHANISMS = (
    Mechanism("roles", "oresearcher.cooperation.roles",
              ("begin", "gradient", "after_step", "before_gather", "decide", "perturb", "exploit"),
              ("cooperation.roles",)),
    Mechanism("gradient sharing", "oresearcher.programs.cooperative_local", ("begin", "share"),
              ("communication.gradient_sharing", "communication.share_every", "communication.codec")),
    Mechanism("privacy", "oresearcher.cooperation.privacy", ("gradient", "after_round"), ("cooperation.privacy",)),
    Mechanism("fusion", "oresearcher.cooperation.fusion", ("start", "fuse"), ("cooperation.fusion",)),
    Mechanism("replay", "oresearcher.cooperation.replay_sharing", ("begin", "after_step"), ("cooperation.replay",)),
    Mechanism("rewards", "oresearcher.tasks.rewards", ("begin", "score"),
              ("cooperation.rewards", "agents.reward_weights")),
    Mechanism("allocation", "oresearcher.cooperation.allocation", ("allocate",), ("cooperation.allocation",)),
    Mechanism("overhead control", "oresearcher.cooperation.budget_round", ("begin", "share", "after_round"),
              ("communication.budget",)),
    Mechanism("ensemble", "oresearcher.cooperation.ensemble", ("ensemble",), ("cooperation.ensemble",)),
    Mechanism("distillation", "oresearcher.cooperation.distill", ("final",), ("distill",)),
)


class Round:
    """One agent's cooperative rounds (see the module doc for the pipeline)."""

    def __init__(self, ctx, learner):
        sc, cfg = ctx.scenario, ctx.scenario.cooperation
        self.ctx, self.learner, self.sc, self.rank, self.n = ctx, learner, sc, ctx.rank, ctx.world_size
        self.ids = arch_ids(sc)
        self.share_group = arch_group(self.ids, self.rank)  # None: the world
        self.members = self.share_group or tuple(range(self.n))
        self.pad_to = max(arch_numel(learner, a) for a in self.ids)
        self.rounds = round_lengths(ctx.steps, sc.communication.interval)
        # the mechanisms; None where the scenario turns one off
        self.roles = Roles(ctx, learner)
        self.allocation = Allocation(ctx, self.roles)
        self.fusion = Fusion(ctx, learner, self.ids)
        self.rewards = Rewards(ctx, learner)
        self.privacy = Privacy(ctx, learner) if cfg.privacy.enabled else None
        self.replay = Replay(ctx, learner) if cfg.replay.enabled else None
        self.loop = ctx.register("loop", LoopState())
        self.sharing = GradientSharing(ctx, self.share_group, self.members, self.roles.costs)
        train_ensemble = cfg.ensemble.train and ctx.numeric and learner.heldout_labels is not None
        self.ensemble = Ensemble(ctx, learner) if train_ensemble else None
        self.val_budget = None  # this round's validation budget (roles.validation_share)

    # ---- the run ---------------------------------------------------------------------

    def run(self):
        """Every round from the restored position on (generator of ops); the final agents."""
        if "loop" in self.ctx.restored:
            self._resumed()
        else:
            if self.ctx.start_step:
                log.warning("no saved cooperative state to resume from: starting again from round 0")
            self.loop.steps_now = self.allocation.first(self.n * self.rounds[0])
        yield from self.fusion.start()
        step = self.loop.step
        for rnd in range(self.loop.round, len(self.rounds)):
            step = yield from self.run_round(rnd, step)
        return self.learner.cooperative_result

    def _resumed(self) -> None:
        """Check a restored position against the backend's; re-apply what lives in the learner."""
        loop, rounds = self.loop, self.rounds
        if self.ctx.start_step != sum(rounds[:loop.round]):
            log.warning("resuming at round %d (nominal step %d), but the backend resumes at step %d",
                        loop.round, sum(rounds[:loop.round]), self.ctx.start_step)
        if loop.round and self.learner.set_reward_weights is not None:  # as the last round's end set them
            self.rewards.weights(loop.round / len(rounds))

    def run_round(self, rnd: int, step: int):
        """One round; its StepDone marks the resume boundary. Returns the next StepDone's step."""
        self.roles.group.round = rnd
        steps_now, last = self.loop.steps_now, rnd == len(self.rounds) - 1
        self.begin(rnd)
        losses, metrics, step = yield from self.local_steps(rnd, step)
        self.sharing.local_done()
        self.val_budget = self.roles.validation_budget(steps_now, rnd)
        info, steps_next = yield from self.end(rnd, losses)
        metrics.update(info)
        metrics.update((yield from self.sharing.after_round(rnd, max(1, steps_now[self.rank]), last)))
        if self.privacy is not None:
            metrics.update(self.privacy.metrics())
        if last:
            metrics.update((yield from self.final(losses)))
        elif self.ctx.eval_interval > 0 and self.ctx.numeric:
            metrics.update((yield Compute(self.learner.evaluate, name="evaluate")))
        self.loop.round, self.loop.step, self.loop.steps_now = rnd + 1, step + 1, list(steps_next)
        self.ctx.mark_boundary(sum(self.rounds[:rnd + 1]) - 1)
        yield StepDone(step, metrics)
        return step + 1

    # ---- the hooks, in a round's order ---------------------------------------------

    def begin(self, rnd: int) -> None:
        """Before the local steps: each mechanism sets up the round."""
        self.roles.begin()
        self.rewards.begin(rnd / len(self.rounds))  # the progress the last round ended at
        if self.replay is not None:
            self.replay.begin(self.loop.steps_now, self.roles.group.roles)
        self.sharing.begin(self.loop.steps_now, self.members)

    def local_steps(self, rnd: int, step: int):
        """This agent's share of the round's compute, in local steps (>= 1, so every round
        ends on a StepDone); every step but the last ends on its own StepDone."""
        my_steps = max(1, self.loop.steps_now[self.rank])
        losses, metrics = [], {}
        for s in range(my_steps):
            metrics = yield from self.train_step(s, step)
            losses.append(metrics.get("loss", float("nan")))
            if self.replay is not None:
                yield from self.replay.after_step(s)
            yield from self.roles.after_step()
            metrics.update(role=R.ROLE_CODES[self.roles.role], lr=current_lr(self.learner), round=rnd)
            if s < my_steps - 1:
                yield StepDone(step, metrics)
                step += 1
        return losses, metrics, step

    def train_step(self, s: int, step: int):
        """One local step: the gradient, the divergence guard, the share or the plain update."""
        ctx, learner = self.ctx, self.learner
        share, codec = self.sharing.plan_step(s)
        metrics = yield self.gradient_op()
        if D.policy(ctx.scenario) == "stop" and ctx.numeric:
            what = yield Compute(lambda: D.find((metrics or {}).get("loss"), D.learner_grads(learner)),
                                 name="finite_check")
            if what:
                raise D.Diverged(D.diverged_message(ctx.rank, step, what, ctx.scenario.training.lr))
        if share:
            reduced = yield from self.sharing.exchange(learner, codec)
            yield Compute(learner.apply_grads, reduced, name="optimizer")
        else:
            yield Compute(learner.optimizer_step, name="optimizer")
        return dict(metrics or {})

    def gradient_op(self) -> Compute:
        """The step's forward-backward: the first mechanism that claims it (privacy, then
        roles' SAM), else the plain one."""
        flops = self.learner.fwd_flops + self.learner.bwd_flops
        for m in (self.privacy, self.roles):
            op = m.gradient_op(flops) if m is not None else None
            if op is not None:
                return op
        return Compute(self.learner.forward_backward, flops=flops, name="fwd_bwd")

    def exchange(self, losses):
        """Every agent's parameters and the validators' scores, gathered: (flats, Published
        or None in shape mode, numeric)."""
        flats = yield from gather_params(self.ctx, self.learner, self.pad_to)
        numeric = self.ctx.numeric and flats[0].device.type != "meta"
        train_loss = float(torch.tensor(losses).nanmean()) if losses else float("nan")
        pub = yield from validate(self.ctx, self.learner, flats, self.ids, self.roles.group.roles, train_loss,
                                  numeric, self.val_budget)
        return flats, pub, numeric

    def end(self, rnd: int, losses):
        """Gather, validate, score, decide, fuse, allocate: (this round's metrics, the next
        round's steps). Every rank computes the same decisions from the same numbers."""
        units = self.n * self.rounds[rnd + 1] if rnd + 1 < len(self.rounds) else 0
        yield from self.roles.before_gather()
        flats, pub, numeric = yield from self.exchange(losses)
        weights = self.rewards.weights((rnd + 1) / len(self.rounds))
        if not numeric:  # shape mode: charge the fusion arithmetic, keep roles and shares
            yield from self.fusion.charge()
            return {}, self.allocation.plan_shape(units)
        if bool(pub.excluded.all()):
            raise all_excluded(self.ctx, rnd)
        rel, rew = round_rewards(pub, weights)
        yield from self.rewards.share_peers(flats, pub, self.ids)
        self.roles.record(pub, rew)
        info, W, pairs = yield from self.fuse(flats, pub, rel, rew)
        if self.ensemble is not None:
            info.update((yield from self.ensemble.fit(flats, self.ids, pub.excluded, self.roles.group.roles)))
        steps, shares = self.allocation.plan(self.rewards.for_allocation(pub), units, pairs)
        me, r = self.fusion.me, self.rank
        info.update(reward=float(rew[r]), reliability=float(rel[r]), excluded=float(pub.excluded[r]),
                    fusion_self_weight=float(W[me, me]), share=float(shares[r]), next_steps=float(steps[r]),
                    w_novelty=weights[1], validators=float(pub.validators))
        if pub.columns:
            info.update({k: float(pub.columns[c][r]) for k, c in
                         (("val_loss", "loss"), ("novelty", "novelty"), ("safety", "safety"),
                          ("calibration", "calibration"))})
        return info, steps

    def fuse(self, flats, pub, rel, rew):
        """Fusion weights, the roles' decisions, the fused (outer-stepped, explorer-noised)
        parameters set, PBT's optimizer state copied: (metrics, weights, exploit pairs)."""
        group_flat, W = yield from self.fusion.weights(flats, rel, pub.excluded)
        info, source, pairs = self.roles.decide(pub, rel, rew, self.ids)
        new = yield from self.fusion.fuse(group_flat, W, source)
        new = yield from self.roles.perturb(new, self.fusion.numel)
        yield Compute(self.learner.set_flat_params, new, name="unpack")
        yield from self.roles.exploit(pairs)
        self.fusion.settle(new)
        return info, W, pairs

    def final(self, losses):
        """After the last round: score the final parameters (the distillation teacher's
        members, left in ``learner.cooperative_result``) and test this agent."""
        ctx, learner, st = self.ctx, self.learner, self.roles.group
        flats, pub, numeric = yield from self.exchange(losses)
        if not numeric:
            return {}
        rel, rew = round_rewards(pub, self.rewards.scheduled(1.0))
        learner.cooperative_result = {
            "roles": list(st.roles), "reliability": rel.tolist(), "reward": rew.tolist(),
            "excluded": pub.excluded.tolist(), "scores": {k: v.tolist() for k, v in pub.columns.items()},
            "state": st.state_dict(),
            "ids": list(self.ids), "flats": flats,  # the final agents: the distillation teacher's members
        }
        if self.ensemble is not None:  # the teacher: fitted on the final agents
            learner.cooperative_result["ensemble_fit"] = yield from self.ensemble.fit(flats, self.ids, pub.excluded,
                                                                                      st.roles)
        out = {"final_reliability": float(rel[ctx.rank]), "final_excluded": float(pub.excluded[ctx.rank])}
        out.update((yield Compute(learner.evaluate, name="evaluate")))
        return out
