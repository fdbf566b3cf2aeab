"""Population-based training alone (Jaderberg et al., "Population Based Training of
Neural Networks", 2017): the PBT baseline of the equal-compute comparison
(:mod:`oresearcher.experiments.methods`).

Agents train independently; every ``communication.interval`` steps each scores itself on
the validation split (charged; a subsample costing the cooperative validators' share of
its round's FLOPs where the task can predict on given rows), the scores and parameters
are all-gathered, and the bottom quarter copies a top-quarter agent's parameters
(exploit) with its learning-rate multiplier times 0.8 or 1.2 (explore). No roles, no
fusion, no shaped loss, no gradient sharing. The copied agent keeps its own optimizer
state (the ops carry parameters only).

It is not a ``training.strategy``: a run takes it in place of the strategy's program
(:func:`oresearcher.experiments.counted.simulate_counted`).
"""
from __future__ import annotations

import math

import torch

from ..cooperation import validation as V
from ..cooperation.roles import pbt_perturb
from ..ops import AllGather, Compute, StepDone
from ..seeds import STREAM, derive
from .cooperative_exchange import _gen, round_lengths, score_rows
from .data_parallel import local_step


def pbt(ctx, learner):
    """PBT exploit/explore alone (module doc). Same on every rank: the decisions come
    from the same gathered numbers and seeded generators."""
    sc, n, rank = ctx.scenario, ctx.world_size, ctx.rank
    rounds = round_lengths(ctx.steps, sc.communication.interval)
    lr_mult = [1.0] * n
    arch = learner.arch
    step, losses = 0, []
    for rnd, length in enumerate(rounds):
        for g in learner.optimizer.param_groups:
            g["lr"] = sc.training.lr * lr_mult[rank]
        losses.clear()
        metrics = {}
        for s in range(length):
            metrics = yield from local_step(learner)
            losses.append(float(metrics.get("loss", float("nan"))))
            if s < length - 1:
                yield StepDone(step, metrics)
                step += 1
        if rnd < len(rounds) - 1:
            yield from _exploit(ctx, learner, arch, lr_mult, rnd, losses, length)
        metrics = dict(metrics, lr_mult=lr_mult[rank], **(yield Compute(learner.evaluate, name="evaluate")))
        yield StepDone(step, metrics)
        step += 1


def _exploit(ctx, learner, arch, lr_mult, rnd, losses, length):
    sc, n, rank = ctx.scenario, ctx.world_size, ctx.rank
    flat = yield Compute(learner.flat_params, name="pack")
    # scored on the cooperative validators' share of this round's FLOPs (its own steps), as
    # they are, where the task can predict on given rows; else on the whole split
    share = sc.cooperation.roles.validation_share
    budget = None if share is None else (share * length * float(learner.fwd_flops + learner.bwd_flops),
                                         derive(sc.seed, rnd, 31, prime=STREAM))
    rows = score_rows(ctx, learner, budget, agents=1)
    if rows is not None:
        res = yield Compute(V.shard_scores, learner, flat, arch, 0, 1, rows, name="validate")
        yield Compute(flops=float(res.get("flops", 0.0)), name="validate")
        score = float(res["metric"])
    elif learner.evaluate_params is not None:  # validation score, charged as the validators' are
        res = yield Compute(learner.evaluate_params, flat, arch, name="validate")
        yield Compute(flops=float(res.get("flops", 0.0)), name="validate")
        score = float(res["metric"])
    else:  # no validation metric (synthetic-lm): the round's training loss
        score = -float(torch.tensor(losses).nanmean())
    score = score if math.isfinite(score) else float("-inf")
    scores = yield AllGather(torch.tensor([score], dtype=torch.float64), name="score_gather")
    flats = yield AllGather(flat, name="param_gather")
    s = torch.cat([x.reshape(-1) for x in scores])
    order = sorted(range(n), key=lambda i: (-float(s[i]), i))  # best first, ties by rank
    q = max(1, n // 4) if n > 1 else 0
    top, bottom = order[:q], order[n - q:] if q else []
    new_mult = list(lr_mult)
    for k, i in enumerate(bottom):
        g = _gen(sc.seed, rnd, n + i)
        donor = top[int(torch.randint(len(top), (1,), generator=g))]
        new_mult[i] = pbt_perturb(lr_mult[donor], g)
        if i == rank:
            yield Compute(learner.set_flat_params, flats[donor].clone(), name="exploit")
    lr_mult[:] = new_mult
