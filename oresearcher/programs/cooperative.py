"""The cooperative O-Researcher program: roles, fusion rounds, rewards, resource shares.

``cooperative(ctx, learner)`` is one agent's generator of ops (training.strategy =
"oresearcher"); the same code runs in the simulator and on torch.distributed. Training
is cut into rounds of ``communication.interval`` steps. A round:

1. Local steps (how many: this agent's share of the round's compute, see
   :mod:`oresearcher.cooperation.allocation`); its role shapes them (:mod:`oresearcher.cooperation.roles`):
   explorer lr x scale, optimizer SAM (one Compute charged 2x) or SWA, validator plain.
   Every ``share_every`` steps agents of one architecture average gradients (AllReduce,
   or the codec's exchange when ``communication.codec`` is set), for as many steps as
   every member of the group takes this round, so the collectives always pair up.
   With ``cooperation.privacy`` every step's gradient is DP-SGD's, noised by the agent
   before the codec sees it (:mod:`oresearcher.cooperation.privacy`); with ``cooperation.replay``
   every ``sync_every`` steps (as many as every agent takes) one AllGather shares new rows
   and priorities of the group's replay pool (:mod:`oresearcher.cooperation.replay_sharing`).
2. AllGather of every agent's flat parameters (zero-padded to the largest model, so
   architectures can differ): one message serves the validators and the fusion.
3. Validators evaluate every agent on held-out data (``learner.evaluate_params``) and
   everyone AllGathers a small score tensor (:func:`oresearcher.cooperation.roles.encode_report`).
4. Every rank computes the same decisions from the same gathered numbers, so no further
   messages are needed: rewards (:mod:`oresearcher.tasks.rewards`, scheduled weights),
   attention fusion weights per architecture group (:mod:`oresearcher.cooperation.fusion`, flagged
   agents get 0), the new roles with their reasons, PBT exploit/explore, the next
   round's local steps. Then each agent sets its own fused (or exploited, or noised)
   parameters; an optional outer Nesterov step acts on the fusion pseudo-gradient.

After the last round the final parameters are gathered and scored once more, so the
agents and their validator scores are ready for the final fusion into one model; they
are left in ``learner.cooperative_result``. Role switches are logged with their reason
and reported in StepDone metrics ("role" is the code in :data:`oresearcher.cooperation.roles.ROLE_CODES`,
"role_switch" the reason string).

Resuming (see :mod:`oresearcher.programs`): a round's end is the only resume boundary.
Its StepDone is marked as nominal step ``sum(rounds[:r+1]) - 1`` -- the same on every
rank although agents take different numbers of local steps -- and a checkpoint due
mid-round is written at the end of that round. Registered state: "group" (roles, lr
multipliers, reward history), "allocation", "swa", "outer", "loop" (next round, this
rank's StepDone counter, the next round's planned steps), the codec, "privacy" (noise
generator, steps accounted) and "replay" (this agent's replica of the pool).

What the program asks of a learner beyond the Learner interface (all optional; shape
mode and foreign tasks fall back to training-loss scores): ``evaluate_params(flat, arch)``
-> dict(metric in [0, 1], loss, calibration, safety, probs, flops), ``arch_numel(arch)``,
``set_exploration(scale)``, ``set_reward_weights(w)``, ``set_peers([(arch, flat)])`` (the
other healthy agents' gathered parameters, for a reward-shaped loss; only with
``cooperation.rewards.shape_loss``); and for SAM and per-agent learning
rates the TorchLearner attributes ``module``, ``loss_fn``, ``batches``, ``optimizer``.
"""
from __future__ import annotations

import logging
import math

import torch

from . import divergence as D
from ..cooperation import ensemble as E
from ..cooperation import privacy as P
from ..cooperation import replay_sharing as RS
from ..cooperation import roles as R
from ..cooperation.allocation import AllocationState
from ..cooperation.budget_round import BudgetRun
from ..cooperation.fusion import fuse, group_weights
from ..ops import Compute, StepDone
from ..cooperation.outer import OuterNesterov
from ..tasks.rewards import scheduled_weights
from .cooperative_agent import agent_privacy, agent_replay, configure, current_lr, set_peer_term, validation_budget
from .cooperative_hosted import hosted_program
from .cooperative_round import (  # noqa: F401 (GroupState, LoopState, ... importable from here too)
    GroupState, LoopState, _exploit_optimizer_state, _finite_buckets, _gen, _healthy_average, arch_group, arch_ids,
    gather_params, initial_lr_mult, round_lengths, round_rewards, step_cost, validate)

log = logging.getLogger(__name__)


# ---- the pieces of a round (generators of ops) ----------------------------------------

def train_step(ctx, learner, role, cfg, share_group, share, codec, privacy=None, step=0, timer=None, knob=1.0):
    """One local step of ``role``; gradients averaged over ``share_group`` if ``share``.
    With ``privacy`` every step's gradient is DP-SGD's (oresearcher.cooperation.privacy), noised
    before the codec compresses it. ``training.on_divergence: stop`` checks the loss and
    gradients first (oresearcher.programs.divergence); skip is the isolation below."""
    flops = learner.fwd_flops + learner.bwd_flops
    if privacy is not None:
        metrics = yield Compute(P.private_forward_backward, learner, privacy, name="dp_fwd_bwd",
                                flops=P.private_step_flops(flops, privacy.batch, learner.numel))
    elif role == "optimizer" and cfg.roles.optimizer_method == "sam":
        metrics = yield Compute(R.sam_forward_backward, learner, cfg.roles.sam_rho * knob, flops=2 * flops,
                                name="sam_fwd_bwd")
    else:
        metrics = yield Compute(learner.forward_backward, flops=flops, name="fwd_bwd")
    if D.policy(ctx.scenario) == "stop" and ctx.numeric:
        what = yield Compute(lambda: D.find((metrics or {}).get("loss"), D.learner_grads(learner)), name="finite_check")
        if what:
            raise D.Diverged(D.diverged_message(ctx.rank, step, what, ctx.scenario.training.lr))
    if share:
        if timer is not None:  # communication.budget: time blocked at the share
            timer.begin_share()
        buckets = yield Compute(_finite_buckets, learner, name="pack")
        reduced = yield from _healthy_average(ctx, buckets, share_group, codec)
        if timer is not None:
            timer.end_share()
        yield Compute(learner.apply_grads, reduced, name="optimizer")
    else:
        yield Compute(learner.optimizer_step, name="optimizer")
    return dict(metrics or {})


# ---- the program ------------------------------------------------------------------------

def cooperative(ctx, learner):
    """O-Researcher: cooperative training of ``ctx.world_size`` agents (see module doc)."""
    sc, cfg, rank, n = ctx.scenario, ctx.scenario.cooperation, ctx.rank, ctx.world_size
    if cfg.allocation.agents_per_device > 1:  # several agents per rank, device time by shares
        return (yield from hosted_program(ctx, learner))
    ids = arch_ids(sc)
    share_group = arch_group(ids, rank)
    members = share_group or tuple(range(n))
    pad_to = max(learner.arch_numel(a) for a in ids)
    lr_mult, knob_mult = initial_lr_mult(sc.seed, n, cfg.roles.lr_range, cfg.roles.knob_range)
    st = ctx.register("group", GroupState(R.initial_roles(n, sc.agents.roles, cfg.roles.policy), lr_mult,
                                          knob_mult=knob_mult))
    alloc = ctx.register("allocation", AllocationState(n, cfg.allocation.temperature, cfg.allocation.floor,
                                                       cfg.allocation.enabled))
    rounds = round_lengths(ctx.steps, sc.communication.interval)
    codec = ctx.codec
    outer = OuterNesterov(cfg.fusion.outer_lr, cfg.fusion.outer_momentum) if cfg.fusion.outer == "nesterov" else None
    costs = lambda: [step_cost(r, cfg.roles.optimizer_method) for r in st.roles]  # noqa: E731
    swa = ctx.register("swa", R.SWAState())
    privacy = agent_privacy(ctx, learner) if cfg.privacy.enabled else None
    replay = agent_replay(ctx, learner) if cfg.replay.enabled else None
    loop = ctx.register("loop", LoopState())
    budget = BudgetRun(ctx, costs) if sc.communication.budget is not None else None  # oresearcher.cooperation.budget
    if cfg.ensemble.train and ctx.numeric and learner.heldout_labels is not None:  # fitted every round
        ctx.register("ensemble", E.from_scenario(sc, learner.n_classes))
    if "loop" in ctx.restored:
        _resumed(ctx, learner, loop, rounds)
    else:
        if ctx.start_step:
            log.warning("no saved cooperative state to resume from: starting again from round 0")
        loop.steps_now, _ = alloc.plan([float("nan")] * n, n * rounds[0], costs())
    if outer is not None:
        ctx.register("outer", outer).to(ctx.device)  # a checkpoint loads on the CPU
        if outer.anchor is None:
            outer.set_anchor((yield Compute(learner.flat_params, name="pack")))
    step = loop.step
    for rnd in range(loop.round, len(rounds)):
        st.round = rnd
        role, steps_now = st.roles[rank], loop.steps_now
        configure(learner, cfg, role, st.lr_mult[rank], sc)
        set_peer_term(learner, cfg.rewards, rnd / len(rounds))  # the progress the last round ended at
        my_steps = max(1, steps_now[rank])  # >= 1 so every round ends on a StepDone
        shared_steps = min(max(1, steps_now[i]) for i in members)
        world_steps = min(max(1, x) for x in steps_now)  # replay rounds: every agent takes part
        if replay is not None and cfg.replay.apex_epsilon and learner.set_fixed_epsilon is not None:
            learner.set_fixed_epsilon(RS.apex_epsilons(st.roles)[rank])
        losses, metrics = [], {}
        if budget is not None:
            budget.plan(steps_now, members)
        for s in range(my_steps):
            share = (sc.communication.gradient_sharing and len(members) > 1 and s < shared_steps
                     and s % sc.communication.share_every == 0)
            if budget is None:
                metrics = yield from train_step(ctx, learner, role, cfg, share_group, share, codec, privacy, step,
                                                knob=st.knob_mult[rank])
            else:  # time-balanced sharing and the rung's codec
                share = sc.communication.gradient_sharing and len(members) > 1 and budget.share_at(s)
                metrics = yield from train_step(ctx, learner, role, cfg, share_group, share, budget.codec, privacy,
                                                step, timer=budget.timer, knob=st.knob_mult[rank])
            losses.append(metrics.get("loss", float("nan")))
            if replay is not None and s < world_steps and (s + 1) % cfg.replay.sync_every == 0:
                yield from RS.share(replay, replay.message_numel)
            if role == "optimizer" and cfg.roles.optimizer_method == "swa":
                yield Compute(lambda: swa.update(learner.flat_params()), flops=2.0 * learner.numel, name="swa")
            metrics.update(role=R.ROLE_CODES[role], lr=current_lr(learner), round=rnd)
            if s < my_steps - 1:
                yield StepDone(step, metrics)
                step += 1
        progress = (rnd + 1) / len(rounds)
        if budget is not None:
            budget.timer.local_done()
        val_budget = validation_budget(sc, learner, st, steps_now, rnd)
        info, steps_next = yield from _round_end(ctx, learner, st, alloc, outer, swa, ids, pad_to, losses, progress,
                                                 units=n * rounds[rnd + 1] if rnd + 1 < len(rounds) else 0,
                                                 budget=val_budget)
        metrics.update(info)
        if budget is not None and rnd + 1 < len(rounds):  # decide the next round on gathered timings
            budget.timer.sync_done()
            metrics.update((yield from budget.end_round(rnd, my_steps)))
        if privacy is not None:  # per agent, at the scenario's delta (report and TensorBoard)
            metrics.update(epsilon=privacy.epsilon(), noise_multiplier=privacy.sigma)
        if rnd == len(rounds) - 1:
            metrics.update((yield from _final(ctx, learner, st, ids, pad_to, losses, val_budget)))
        elif ctx.eval_interval > 0 and ctx.numeric:
            metrics.update((yield Compute(learner.evaluate, name="evaluate")))
        loop.round, loop.step, loop.steps_now = rnd + 1, step + 1, list(steps_next)
        ctx.mark_boundary(sum(rounds[:rnd + 1]) - 1)
        yield StepDone(step, metrics)
        step += 1
    return learner.cooperative_result


def _resumed(ctx, learner, loop, rounds) -> None:
    """Check a restored position against the backend's; re-apply what lives in the learner."""
    sc = ctx.scenario
    if ctx.start_step != sum(rounds[:loop.round]):
        log.warning("resuming at round %d (nominal step %d), but the backend resumes at step %d",
                    loop.round, sum(rounds[:loop.round]), ctx.start_step)
    if loop.round and learner.set_reward_weights is not None:  # as _round_end set them last
        learner.set_reward_weights(scheduled_weights(sc.agents.reward_weights, loop.round / len(rounds),
                                                     sc.cooperation.rewards.schedule,
                                                     sc.cooperation.rewards.novelty_boost))


def _round_end(ctx, learner, st, alloc, outer, swa, ids, pad_to, losses, progress, units, budget=None):
    """Gather, validate, decide, fuse; returns (metrics of this round, next round's steps)."""
    sc, cfg, rank, n = ctx.scenario, ctx.scenario.cooperation, ctx.rank, ctx.world_size
    if swa.count:
        yield Compute(lambda: learner.set_flat_params(swa.take(learner.dtype)), name="swa_apply")
    flats = yield from gather_params(ctx, learner, pad_to)
    numeric = ctx.numeric and flats[0].device.type != "meta"
    train_loss = float(torch.tensor(losses).nanmean()) if losses else float("nan")
    pub = yield from validate(ctx, learner, flats, ids, st.roles, train_loss, numeric, budget)
    weights = scheduled_weights(sc.agents.reward_weights, progress, cfg.rewards.schedule, cfg.rewards.novelty_boost)
    if learner.set_reward_weights is not None:
        learner.set_reward_weights(weights)
    members = [i for i, a in enumerate(ids) if a == ids[rank]]
    me = members.index(rank)
    numel = learner.arch_numel(ids[rank])
    if not numeric:  # shape mode: charge the fusion arithmetic, keep roles and shares
        yield Compute(flops=2.0 * len(members) * numel, name="fusion")
        steps, _ = alloc.plan([0.0] * n, units, [step_cost(r, cfg.roles.optimizer_method) for r in st.roles]) if units else ([], None)
        return {}, steps
    if bool(pub.excluded.all()):  # the same numbers on every rank: all stop together
        raise D.AllExcluded(D.excluded_message(f"round {st.round}", n, "agents have a non-finite or diverging "
                                               "loss", sc.training.lr))
    rel, rew = round_rewards(pub, weights)
    if cfg.rewards.shape_loss and cfg.rewards.peer_term != "none" and learner.set_peers is not None:
        # the peer ensemble of the shaped loss (its forwards are charged in fwd_flops)
        peers = [(ids[j], flats[j]) for j in range(n) if j != rank and not bool(pub.excluded[j])]
        yield Compute(learner.set_peers, peers, name="peer_snapshot")
    st.rewards.append([float(x) for x in rew])
    healthy_losses = (pub.columns["loss"] if pub.columns else pub.train_loss)[~pub.excluded]
    st.val_losses.append(float(healthy_losses.min()) if healthy_losses.numel() else float("nan"))
    group_flat = torch.stack([flats[i][:numel] for i in members])
    W = yield Compute(group_weights, group_flat, rel[members], pub.excluded[members], method=cfg.fusion.method,
                      temperature=cfg.fusion.temperature, similarity_weight=cfg.fusion.similarity_weight,
                      flops=float(2 * len(members) ** 2 * numel), name="fusion_weights")
    info = _decide(ctx, st, pub, rel, rew, ids)
    pairs = info.pop("_pairs")
    source = members.index(info.pop("_source"))
    new = yield Compute(fuse, group_flat, W[source], flops=2.0 * len(members) * numel, name="fusion")
    if outer is not None:
        new = yield Compute(outer.step, new, name="outer_step")
    if st.roles[rank] == "explorer":
        new = yield Compute(R.param_noise, new, cfg.roles.explorer_noise * st.knob_mult[rank],
                            _gen(sc.seed, st.round, rank),
                            flops=2.0 * numel, name="explore_noise")
    yield Compute(learner.set_flat_params, new, name="unpack")
    yield from _exploit_optimizer_state(ctx, learner, pairs)
    if outer is not None:
        outer.set_anchor(new)
    if "ensemble" in ctx.state:  # the outputs' attention ensemble, refitted on the agents of this round
        info.update((yield from E.fit_round(ctx.state["ensemble"], learner, flats, ids, pub.excluded, rank,
                                            E.fitter_rank(st.roles))))
    costs = [step_cost(r, cfg.roles.optimizer_method) for r in st.roles]
    # shares from rewards under one weighting (the scheduled weights change every round)
    _, alloc_rew = round_rewards(pub, tuple(sc.agents.reward_weights))
    steps, shares = alloc.plan(alloc_rew.tolist(), units, costs) if units else ([1] * n, torch.full((n,), 1.0 / n))
    for loser, _ in pairs:  # its next improvement is the winner's weights, not its own
        alloc.last_reward[loser] = float("nan")
    info.update(reward=float(rew[rank]), reliability=float(rel[rank]), excluded=float(pub.excluded[rank]),
                fusion_self_weight=float(W[me, me]), share=float(shares[rank]), next_steps=float(steps[rank]),
                w_novelty=weights[1], validators=float(pub.validators))
    if pub.columns:
        info.update(val_loss=float(pub.columns["loss"][rank]), novelty=float(pub.columns["novelty"][rank]),
                    safety=float(pub.columns["safety"][rank]), calibration=float(pub.columns["calibration"][rank]))
    return info, steps


def _decide(ctx, st, pub, rel, rew, ids) -> dict:
    """Roles, PBT exploit/explore: pure functions of gathered numbers, the same on every rank.

    Returns this rank's metrics plus "_source": whose fusion row it takes (itself, or
    the winner it copies under PBT exploit).
    """
    sc, cfg, rank, n = ctx.scenario, ctx.scenario.cooperation, ctx.rank, ctx.world_size
    info, source, pairs = {}, rank, []
    if cfg.roles.policy == "dynamic":
        # truncation selection ranks by the validators' held-out metric, as PBT ranks by
        # validation performance (Jaderberg et al. 2017): the reward's novelty term would
        # rank an agent that is merely different above one that is good
        pairs = R.exploit_pairs(rel, pub.excluded, ids, cfg.roles.exploit_fraction)
        for loser, winner in pairs:  # truncation selection: weights, optimizer state, multipliers
            st.lr_mult[loser], st.knob_mult[loser] = st.lr_mult[winner], st.knob_mult[winner]
            if loser == rank:
                source = winner
                info["exploit_from"] = float(winner)
                log.info("agent %d: PBT exploit, copies agent %d (held-out metric %.3f < %.3f)",
                         rank, winner, float(rel[loser]) if math.isfinite(float(rel[loser])) else float("nan"),
                         float(rel[winner]))
        hard, plateau, spread = R.difficulty(st.val_losses, rel, pub.excluded, cfg.roles.plateau_rounds,
                                             cfg.roles.plateau_tol)
        reason = f"round {st.round}: difficulty {hard:.2f} (plateau {plateau:.2f}, spread {spread:.2f})"
        st.roles, switches = R.assign_roles(st.roles, rew, pub.excluded, hard, reason)
        info["difficulty"] = hard
        for sw in switches:
            if sw.rank == rank:
                log.info("agent %d: role %s -> %s (%s)", rank, sw.old, sw.new, sw.reason)
                info["role_switch"] = f"{sw.old}->{sw.new}: {sw.reason}"
    losers = {loser for loser, _ in pairs}
    f = cfg.roles.perturb_factor
    for i in range(n):  # PBT explore: who just copied a winner, and explorers every round
        if i in losers or st.roles[i] == "explorer":
            g = _gen(sc.seed, st.round, n + i)
            st.lr_mult[i] = R.pbt_perturb(st.lr_mult[i], g, cfg.roles.lr_range, (1 / f, f))
            st.knob_mult[i] = R.pbt_perturb(st.knob_mult[i], g, cfg.roles.knob_range, (1 / f, f))
    info["next_role"] = float(R.ROLE_CODES[st.roles[rank]])
    info.update(lr_mult=float(st.lr_mult[rank]), knob_mult=float(st.knob_mult[rank]))  # the next round's
    info["_source"], info["_pairs"] = source, pairs
    return info


def _final(ctx, learner, st, ids, pad_to, losses, budget=None):
    """Score the final parameters (for the fusion into one model) and test this agent."""
    flats = yield from gather_params(ctx, learner, pad_to)
    numeric = ctx.numeric and flats[0].device.type != "meta"
    train_loss = float(torch.tensor(losses).nanmean()) if losses else float("nan")
    pub = yield from validate(ctx, learner, flats, ids, st.roles, train_loss, numeric, budget)
    if not numeric:
        return {}
    weights = scheduled_weights(ctx.scenario.agents.reward_weights, 1.0, ctx.scenario.cooperation.rewards.schedule,
                                ctx.scenario.cooperation.rewards.novelty_boost)
    rel, rew = round_rewards(pub, weights)
    learner.cooperative_result = {
        "roles": list(st.roles), "reliability": rel.tolist(), "reward": rew.tolist(),
        "excluded": pub.excluded.tolist(), "scores": {k: v.tolist() for k, v in pub.columns.items()},
        "state": st.state_dict(),
        "ids": list(ids), "flats": flats,  # the final agents: the distillation teacher's members
    }
    if "ensemble" in ctx.state:  # the teacher: fitted on the final agents
        out_ens = yield from E.fit_round(ctx.state["ensemble"], learner, flats, ids, pub.excluded, ctx.rank,
                                         E.fitter_rank(st.roles))
        learner.cooperative_result["ensemble_fit"] = out_ens
    out = {"final_reliability": float(rel[ctx.rank]), "final_excluded": float(pub.excluded[ctx.rank])}
    out.update((yield Compute(learner.evaluate, name="evaluate")))
    return out
