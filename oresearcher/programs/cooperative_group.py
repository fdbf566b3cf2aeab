"""The mechanisms of the cooperative round that act on the whole group: roles (with PBT
and the validators' budget), rewards, fusion, allocation and the trained output ensemble.
Each is a thin shell over its :mod:`oresearcher.cooperation` module at the
:class:`~oresearcher.programs.cooperative_round.Round`'s hooks. Every decision is a pure
function of numbers every rank gathered, so every rank takes the same one.
"""
from __future__ import annotations

import logging
import math

import torch

from . import divergence as D
from ..cooperation import ensemble as E
from ..cooperation import roles as R
from ..cooperation.allocation import AllocationState
from ..cooperation.fusion import fuse, group_weights
from ..cooperation.outer import OuterNesterov
from ..ops import Compute, Recv, Send
from ..seeds import STREAM, derive
from ..tasks.rewards import agreement_weight, scheduled_weights
from .cooperative_exchange import GroupState, _gen, initial_lr_mult, round_rewards, step_cost

log = logging.getLogger("oresearcher.programs.cooperative")  # role switches and PBT exploits: the program's log


def arch_numel(learner, arch) -> int:
    """Parameters of an agent of architecture ``arch`` (a one-model learner: its own)."""
    return learner.arch_numel(arch)


def set_lr(learner, lr: float) -> None:
    for g in (learner.optimizer.param_groups if learner.optimizer is not None else ()):
        g["lr"] = lr


def current_lr(learner) -> float:
    groups = learner.optimizer.param_groups if learner.optimizer is not None else None
    return float(groups[0]["lr"]) if groups else float("nan")


class Roles:
    """``cooperation.roles``: explorers (lr x scale, parameter noise), optimizers (SAM, one
    Compute charged 2x, or SWA), validators (score everyone on held-out data), switched
    by difficulty; PBT exploit/explore on per-agent lr and knob multipliers
    (:mod:`oresearcher.cooperation.roles`). State: "group" and "swa"."""

    def __init__(self, ctx, learner):
        sc, cfg = ctx.scenario, ctx.scenario.cooperation.roles
        self.ctx, self.learner, self.sc, self.cfg, self.rank, self.n = ctx, learner, sc, cfg, ctx.rank, ctx.world_size
        lr_mult, knob_mult = initial_lr_mult(sc.seed, self.n, cfg.lr_range, cfg.knob_range)
        self.group = ctx.register("group", GroupState(R.initial_roles(self.n, sc.agents.roles, cfg.policy), lr_mult,
                                                      knob_mult=knob_mult))
        self.swa = ctx.register("swa", R.SWAState())

    @property
    def role(self) -> str:
        return self.group.roles[self.rank]

    def costs(self) -> list:
        """Compute units of one local step of each agent's current role."""
        return [step_cost(r, self.cfg.optimizer_method) for r in self.group.roles]

    def begin(self) -> None:
        """Hook ``begin``: the role's learning rate and exploration before its local steps."""
        explorer = self.role == "explorer"
        set_lr(self.learner, self.sc.training.lr * self.group.lr_mult[self.rank]
               * (self.cfg.explorer_lr_scale if explorer else 1.0))
        if self.learner.set_exploration is not None:
            self.learner.set_exploration(self.cfg.explorer_epsilon_scale if explorer else 1.0)

    def gradient_op(self, flops: float):
        """Hook ``gradient``: an optimizer's SAM step (None: the plain one)."""
        if self.role == "optimizer" and self.cfg.optimizer_method == "sam":
            return Compute(R.sam_forward_backward, self.learner, self.cfg.sam_rho * self.group.knob_mult[self.rank],
                           flops=2 * flops, name="sam_fwd_bwd")
        return None

    def after_step(self):
        """Hook ``after_step``: an SWA optimizer averages its iterates."""
        if self.role == "optimizer" and self.cfg.optimizer_method == "swa":
            yield Compute(lambda: self.swa.update(self.learner.flat_params()), flops=2.0 * self.learner.numel,
                          name="swa")

    def validation_budget(self, steps_now, rnd):
        """(FLOPs, seed) the validators may spend this round: ``roles.validation_share`` of the
        round's training FLOPs (every agent's steps x its step's units x this agent's step
        FLOPs, peers' forwards included); None: score the whole split."""
        share = self.cfg.validation_share
        if share is None:
            return None
        units = sum(max(1, k) * c for k, c in zip(steps_now, self.costs()))
        return share * units * float(self.learner.fwd_flops + self.learner.bwd_flops), derive(self.sc.seed, rnd, 31,
                                                                                               prime=STREAM)

    def before_gather(self):
        """Hook ``before_gather``: an SWA optimizer hands in its average."""
        if self.swa.count:
            yield Compute(lambda: self.learner.set_flat_params(self.swa.take(self.learner.dtype)), name="swa_apply")

    def record(self, pub, rew) -> None:
        """The round's rewards and best healthy validation loss (difficulty's plateau)."""
        st = self.group
        st.rewards.append([float(x) for x in rew])
        healthy_losses = (pub.columns["loss"] if pub.columns else pub.train_loss)[~pub.excluded]
        st.val_losses.append(float(healthy_losses.min()) if healthy_losses.numel() else float("nan"))

    def decide(self, pub, rel, rew, ids) -> tuple[dict, int, list]:
        """Hook ``decide``: PBT exploit/explore and the next roles, pure functions of the
        gathered numbers. Returns (this rank's metrics, whose fusion row it takes: itself or
        the winner it copies, the (loser, winner) pairs)."""
        st, cfg, rank, n = self.group, self.cfg, self.rank, self.n
        info, source, pairs = {}, rank, []
        if cfg.policy == "dynamic":
            # truncation selection ranks by the validators' held-out metric, as PBT ranks by
            # validation performance (Jaderberg et al. 2017): the reward's novelty term would
            # rank an agent that is merely different above one that is good
            pairs = R.exploit_pairs(rel, pub.excluded, ids, cfg.exploit_fraction)
            for loser, winner in pairs:  # truncation selection: weights, optimizer state, multipliers
                st.lr_mult[loser], st.knob_mult[loser] = st.lr_mult[winner], st.knob_mult[winner]
                if loser == rank:
                    source = winner
                    info["exploit_from"] = float(winner)
                    log.info("agent %d: PBT exploit, copies agent %d (held-out metric %.3f < %.3f)", rank, winner,
                             float(rel[loser]) if math.isfinite(float(rel[loser])) else float("nan"),
                             float(rel[winner]))
            info.update(self._switch(pub, rel, rew))
        losers = {loser for loser, _ in pairs}
        f = cfg.perturb_factor
        for i in range(n):  # PBT explore: who just copied a winner, and explorers every round
            if i in losers or st.roles[i] == "explorer":
                g = _gen(self.sc.seed, st.round, n + i)
                st.lr_mult[i] = R.pbt_perturb(st.lr_mult[i], g, cfg.lr_range, (1 / f, f))
                st.knob_mult[i] = R.pbt_perturb(st.knob_mult[i], g, cfg.knob_range, (1 / f, f))
        info["next_role"] = float(R.ROLE_CODES[st.roles[rank]])
        info.update(lr_mult=float(st.lr_mult[rank]), knob_mult=float(st.knob_mult[rank]))  # the next round's
        return info, source, pairs

    def _switch(self, pub, rel, rew) -> dict:
        """The next roles from the task's difficulty; this rank's switch, logged with its reason."""
        st, cfg = self.group, self.cfg
        hard, plateau, spread = R.difficulty(st.val_losses, rel, pub.excluded, cfg.plateau_rounds, cfg.plateau_tol)
        reason = f"round {st.round}: difficulty {hard:.2f} (plateau {plateau:.2f}, spread {spread:.2f})"
        st.roles, switches = R.assign_roles(st.roles, rew, pub.excluded, hard, reason)
        info = {"difficulty": hard}
        for sw in switches:
            if sw.rank == self.rank:
                log.info("agent %d: role %s -> %s (%s)", self.rank, sw.old, sw.new, sw.reason)
                info["role_switch"] = f"{sw.old}->{sw.new}: {sw.reason}"
        return info

    def perturb(self, new, numel: int):
        """Hook ``perturb``: an explorer's fused parameters, noised."""
        if self.role != "explorer":
            return new
        st = self.group
        return (yield Compute(R.param_noise, new, self.cfg.explorer_noise * st.knob_mult[self.rank],
                              _gen(self.sc.seed, st.round, self.rank), flops=2.0 * numel, name="explore_noise"))

    def exploit(self, pairs):
        """Hook ``exploit``: PBT exploit copies the winner's optimizer state too (a Send from the
        winner, a Recv by the loser; the same pairs on every rank). Learners without a torch
        optimizer (shape mode, foreign tasks) have none to copy."""
        learner, rank = self.learner, self.rank
        if learner.optimizer is None or not learner.params:
            return
        for loser, winner in pairs:
            if rank == winner:
                yield Send((yield Compute(R.optimizer_state_flat, learner, name="pack")), dst=loser,
                           name="exploit_state")
            elif rank == loser:
                mine = yield Compute(R.optimizer_state_flat, learner, name="pack")
                theirs = yield Recv(mine, src=winner, name="exploit_state")
                yield Compute(R.load_optimizer_state_flat, learner, theirs, name="unpack")


class Rewards:
    """``cooperation.rewards`` and ``agents.reward_weights``: the scheduled reward weights,
    the shaped loss's peer term (:mod:`oresearcher.tasks.rewards`), each agent's reward and
    reliability from the validators' scores."""

    def __init__(self, ctx, learner):
        self.ctx, self.learner, self.sc, self.cfg = ctx, learner, ctx.scenario, ctx.scenario.cooperation.rewards

    def begin(self, progress: float) -> None:
        """Hook ``begin``: the peer term and the agreement weight at ``progress`` (where the
        last round ended)."""
        if self.learner.set_peer_term is not None:
            self.learner.set_peer_term(self.cfg.peer_term, agreement_weight(self.cfg.agreement_weight, progress,
                                                                            self.cfg.schedule))

    def scheduled(self, progress: float) -> tuple:
        return scheduled_weights(self.sc.agents.reward_weights, progress, self.cfg.schedule, self.cfg.novelty_boost)

    def weights(self, progress: float) -> tuple:
        """Hook ``score`` (first half): this round's weights, handed to a reward-shaped loss."""
        w = self.scheduled(progress)
        if self.learner.set_reward_weights is not None:
            self.learner.set_reward_weights(w)
        return w

    def share_peers(self, flats, pub, ids):
        """Hook ``score`` (second half): the other healthy agents' parameters, the peer ensemble
        of the shaped loss (its forwards are charged in fwd_flops)."""
        if self.cfg.shape_loss and self.cfg.peer_term != "none" and self.learner.set_peers is not None:
            rank = self.ctx.rank
            peers = [(ids[j], flats[j]) for j in range(len(flats)) if j != rank and not bool(pub.excluded[j])]
            yield Compute(self.learner.set_peers, peers, name="peer_snapshot")

    def for_allocation(self, pub) -> torch.Tensor:
        """Rewards under one weighting for the allocation (the scheduled weights change every round)."""
        return round_rewards(pub, tuple(self.sc.agents.reward_weights))[1]


class Fusion:
    """``cooperation.fusion``: attention-weighted averaging within each architecture group
    (flagged agents get 0; :mod:`oresearcher.cooperation.fusion`), then an optional outer
    Nesterov step on the fusion pseudo-gradient (:mod:`oresearcher.cooperation.outer`; State "outer")."""

    def __init__(self, ctx, learner, ids):
        cfg, rank = ctx.scenario.cooperation.fusion, ctx.rank
        self.ctx, self.learner, self.cfg = ctx, learner, cfg
        self.members = [i for i, a in enumerate(ids) if a == ids[rank]]
        self.me = self.members.index(rank)
        self.numel = arch_numel(learner, ids[rank])
        self.outer = OuterNesterov(cfg.outer_lr, cfg.outer_momentum) if cfg.outer == "nesterov" else None

    def start(self):
        """Hook ``start``: the outer step's anchor (restored, or the initial parameters)."""
        if self.outer is not None:
            self.ctx.register("outer", self.outer).to(self.ctx.device)  # a checkpoint loads on the CPU
            if self.outer.anchor is None:
                self.outer.set_anchor((yield Compute(self.learner.flat_params, name="pack")))

    def charge(self):
        """Shape mode: the fusion's arithmetic, charged (no values to fuse)."""
        yield Compute(flops=2.0 * len(self.members) * self.numel, name="fusion")

    def weights(self, flats, rel, excluded):
        """Hook ``fuse`` (first half): (the group's parameters [members, numel], attention weights)."""
        m = self.members
        group_flat = torch.stack([flats[i][:self.numel] for i in m])
        W = yield Compute(group_weights, group_flat, rel[m], excluded[m], method=self.cfg.method,
                          temperature=self.cfg.temperature, similarity_weight=self.cfg.similarity_weight,
                          flops=float(2 * len(m) ** 2 * self.numel), name="fusion_weights")
        return group_flat, W

    def fuse(self, group_flat, W, source: int):
        """Hook ``fuse`` (second half): row ``source``'s fused parameters, then the outer step."""
        new = yield Compute(fuse, group_flat, W[self.members.index(source)],
                            flops=2.0 * len(self.members) * self.numel, name="fusion")
        if self.outer is not None:
            new = yield Compute(self.outer.step, new, name="outer_step")
        return new

    def settle(self, new) -> None:
        """The parameters the agent goes on from: the next outer step's anchor."""
        if self.outer is not None:
            self.outer.set_anchor(new)


class Allocation:
    """``cooperation.allocation``: each agent's share of the next round's compute from the
    rewards (:mod:`oresearcher.cooperation.allocation`; State "allocation")."""

    def __init__(self, ctx, roles: Roles):
        c, self.n, self.roles = ctx.scenario.cooperation.allocation, ctx.world_size, roles
        self.state = ctx.register("allocation", AllocationState(self.n, c.temperature, c.floor, c.enabled))

    def first(self, units: int) -> list:
        """The first round's steps (no rewards yet)."""
        return self.state.plan([float("nan")] * self.n, units, self.roles.costs())[0]

    def plan(self, rewards, units: int, pairs) -> tuple[list, torch.Tensor]:
        """Hook ``allocate``: (the next round's steps per agent, shares); none after the last round."""
        n = self.n
        out = self.state.plan(rewards.tolist(), units, self.roles.costs()) if units else ([1] * n,
                                                                                          torch.full((n,), 1.0 / n))
        for loser, _ in pairs:  # its next improvement is the winner's weights, not its own
            self.state.last_reward[loser] = float("nan")
        return out

    def plan_shape(self, units: int) -> list:
        """Shape mode: no rewards travel, so the shares stay as they are."""
        return self.state.plan([0.0] * self.n, units, self.roles.costs())[0] if units else []


class Ensemble:
    """``cooperation.ensemble.train``: the outputs' attention ensemble, refitted every round
    on the agents of that round (:mod:`oresearcher.cooperation.ensemble`; State "ensemble")."""

    def __init__(self, ctx, learner):
        self.ctx, self.learner = ctx, learner
        self.state = ctx.register("ensemble", E.from_scenario(ctx.scenario, learner.n_classes))

    def fit(self, flats, ids, excluded, roles):
        """Hook ``ensemble`` (generator of ops): its metrics."""
        return (yield from E.fit_round(self.state, self.learner, flats, ids, excluded, self.ctx.rank,
                                       E.fitter_rank(roles)))


def all_excluded(ctx, rnd: int):
    """The error when every agent is flagged (the same numbers on every rank: all stop together)."""
    return D.AllExcluded(D.excluded_message(f"round {rnd}", ctx.world_size, "agents have a non-finite or "
                                            "diverging loss", ctx.scenario.training.lr))
