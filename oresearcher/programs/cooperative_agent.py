"""One cooperative agent's set-up: its role's learning rate and knobs, the shaped loss's
peer term, its DP mechanism, its replica of the shared replay pool, and the FLOPs its
validators may spend in a round (:mod:`oresearcher.programs.cooperative` runs the rounds)."""
from __future__ import annotations

from ..cooperation import privacy as P
from ..cooperation import replay_sharing as RS
from ..cooperation.replay import PrioritizedReplay
from ..models.workloads import per_rank_batch
from ..seeds import STREAM, derive
from ..tasks.rewards import agreement_weight
from .cooperative_round import step_cost


def set_lr(learner, lr: float) -> None:
    for g in (learner.optimizer.param_groups if learner.optimizer is not None else ()):
        g["lr"] = lr


def role_lr(cfg, role: str, lr_mult: float, base_lr: float) -> float:
    return base_lr * lr_mult * (cfg.roles.explorer_lr_scale if role == "explorer" else 1.0)


def validation_budget(sc, learner, st, steps_now, rnd):
    """(FLOPs, seed) the validators may spend this round: ``roles.validation_share`` of the
    round's training FLOPs (every agent's steps x its step's units x this agent's step
    FLOPs, peers' forwards included); None: score the whole split."""
    share = sc.cooperation.roles.validation_share
    if share is None:
        return None
    units = sum(max(1, k) * step_cost(r, sc.cooperation.roles.optimizer_method) for k, r in zip(steps_now, st.roles))
    return share * units * float(learner.fwd_flops + learner.bwd_flops), derive(sc.seed, rnd, 31, prime=STREAM)


def agent_privacy(ctx, learner):
    """This agent's DP mechanism; q = its batch / its private data (the task's training
    split unless ``privacy.dataset_size`` says otherwise)."""
    sc = ctx.scenario
    batch = getattr(getattr(learner, "batches", None), "batch", None) or per_rank_batch(sc)
    size = sc.cooperation.privacy.dataset_size or learner.train_size or batch
    return ctx.register("privacy", P.from_scenario(sc, ctx.rank, batch, size))


def agent_replay(ctx, learner):
    """This agent's replica of the shared prioritized pool (oresearcher.cooperation.replay_sharing)."""
    sc, c = ctx.scenario, ctx.scenario.cooperation.replay
    batch = getattr(getattr(learner, "batches", None), "batch", 1)
    spec = learner.replay_spec or {}
    pool = PrioritizedReplay(c.capacity, c.alpha, c.beta_start, beta_steps=sc.training.steps)
    shared = ctx.register("replay", RS.SharedReplay(pool, spec, ctx.rank, c.quota, c.sync_every * batch))
    if learner.use_shared_replay is not None:
        learner.use_shared_replay(shared)
    return shared


def set_peer_term(learner, rewards, progress: float) -> None:
    """The shaped loss's peer term and the agreement weight at ``progress``."""
    if learner.set_peer_term is not None:
        learner.set_peer_term(rewards.peer_term, agreement_weight(rewards.agreement_weight, progress,
                                                                  rewards.schedule))


def current_lr(learner) -> float:
    groups = learner.optimizer.param_groups if learner.optimizer is not None else None
    return float(groups[0]["lr"]) if groups else float("nan")


def configure(learner, cfg, role, lr_mult, sc) -> None:
    """Apply a role's knobs to the learner before its local steps."""
    set_lr(learner, role_lr(cfg, role, lr_mult, sc.training.lr))
    if learner.set_exploration is not None:
        learner.set_exploration(cfg.roles.explorer_epsilon_scale if role == "explorer" else 1.0)
