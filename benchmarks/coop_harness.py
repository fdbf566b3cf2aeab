"""What bench_cooperation.py needs around the simulator: every Compute FLOP counted,
the final learners kept, a population-based-training baseline, one test metric per task.

- :func:`simulate_counted` runs a scenario in the simulator (numeric mode) exactly as
  ``python -m oresearcher.sim`` does, but keeps the learners (their final models are
  what the benchmark scores) and adds up the FLOPs of every Compute op each rank issues:
  the shaped loss's peer forward passes (inside ``fwd_flops``), the validators'
  evaluations, the ensemble fits, the distillation teacher and student -- everything the
  simulator charges. Test-set evaluations are measurement and carry no FLOPs.
- :func:`pbt` is population-based training alone (Jaderberg et al., "Population Based
  Training of Neural Networks", 2017): agents train independently; every
  ``communication.interval`` steps each scores itself on the validation split (charged;
  a subsample costing the cooperative validators' share of its round's FLOPs where the
  task can predict on given rows), the scores and parameters are all-gathered, and the
  bottom quarter copies a top-quarter
  agent's parameters (exploit) with its learning-rate multiplier times 0.8 or 1.2
  (explore). No roles, no fusion, no shaped loss, no gradient sharing. The copied agent
  keeps its own optimizer state (the ops carry parameters only).
- synthetic-lm has no held-out metric of its own: :func:`lm_eval_fn` scores next-token
  accuracy on a fixed held-out stream of the same Markov chain (another generator).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from oresearcher.cooperation import validation as V
from oresearcher.cooperation.roles import pbt_perturb
from oresearcher.programs.cooperative_round import score_rows
from oresearcher.seeds import STREAM, derive
from oresearcher.ops import AllGather, Compute, StepDone, tap
from oresearcher.programs.cooperative_round import _gen, round_lengths
from oresearcher.programs.data_parallel import local_step


def pbt(ctx, learner):
    """PBT exploit/explore alone (module doc). Same on every rank: the decisions come
    from the same gathered numbers and seeded generators."""
    sc, n, rank = ctx.scenario, ctx.world_size, ctx.rank
    rounds = round_lengths(ctx.steps, sc.communication.interval)
    lr_mult = [1.0] * n
    arch = getattr(learner, "arch", None)
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
    elif hasattr(learner, "evaluate_params"):  # validation score, charged as the validators' are
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


def lm_eval_fn(scenario, n_batches: int = 2, batch: int = 16):
    """eval_fn for a synthetic-lm TorchLearner: next-token accuracy on a held-out stream."""
    from oresearcher.models import PRESETS
    from oresearcher.tasks.token_stream import TokenStream

    w = scenario.workload
    stream = TokenStream(PRESETS[w.model].vocab_size, batch, w.seq_len, scenario.seed, rank=10_000)
    data = [stream.next_cpu() for _ in range(n_batches)]

    def fn(module):
        hits = total = 0
        for b in data:
            logits = module(b[:, :-1])
            hits += int((logits.argmax(-1) == b[:, 1:]).sum())
            total += b[:, 1:].numel()
        return {"metric": hits / total}
    return fn


@contextmanager
def instrumented(program=None):
    """Patch the simulator's learner factory and program lookup for one run: yields a
    dict that holds, after the run, ``learners`` and ``flops`` (per rank)."""
    import oresearcher.sim.simulate as S

    got = {"learners": [], "flops": {}, "by_name": {}}
    make, get = S.make_learner, S.get_program

    def make_learner(scenario, rank, **kw):
        learner = make(scenario, rank, **kw)
        if scenario.workload.task == "synthetic-lm":
            learner.eval_fn = lm_eval_fn(scenario)
        got["learners"].append(learner)
        return learner

    def get_program(strategy):
        prog = program or get(strategy)

        def counted(ctx, learner):
            got["flops"][ctx.rank] = 0.0

            def on_op(op):
                if isinstance(op, Compute):
                    got["flops"][ctx.rank] += float(op.flops or 0.0)
                    got["by_name"][op.name] = got["by_name"].get(op.name, 0.0) + float(op.flops or 0.0)
            return (yield from tap(prog(ctx, learner), on_op))
        return counted

    S.make_learner, S.get_program = make_learner, get_program
    try:
        yield got
    finally:
        S.make_learner, S.get_program = make, get


def simulate_counted(scenario, program=None):
    """(report, learners, total FLOPs over ranks, {Compute op name: FLOPs}) of one run."""
    from oresearcher.sim.simulate import simulate

    with instrumented(program) as got:
        report, _ = simulate(scenario, mode="numeric")
    return report, got["learners"], sum(got["flops"].values()), got["by_name"]


def metric_of(learner) -> float:
    return float(learner.evaluate()["metric"])


def averaged_metric(learners) -> float:
    """Test metric of the plain average of the learners' parameters (one architecture):
    DiLoCo's / DDP's replica, the fused model. The first learner holds it while it is
    scored, then gets its own parameters back."""
    first = learners[0]
    own = first.flat_params().detach().clone()
    first.set_flat_params(torch.stack([l.flat_params().detach().double() for l in learners]).mean(0).to(own.dtype))
    try:
        return metric_of(first)
    finally:
        first.set_flat_params(own)
