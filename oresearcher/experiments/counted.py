"""A simulated run with its cost counted and its final models kept, and one test metric
per task: what the equal-compute experiments score.

- :func:`simulate_counted` runs a scenario in the simulator (numeric mode) exactly as
  ``python -m oresearcher.sim`` does, but keeps the learners (their final models are
  what the experiments score) and adds up the FLOPs of every Compute op each rank issues:
  the shaped loss's peer forward passes (inside ``fwd_flops``), the validators'
  evaluations, the ensemble fits, the distillation teacher and student -- everything the
  simulator charges. Test-set evaluations are measurement and carry no FLOPs.
- synthetic-lm has no held-out metric of its own: :func:`lm_eval_fn` scores next-token
  accuracy on a fixed held-out stream of the same Markov chain (another generator).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..ops import Compute, tap


def lm_eval_fn(scenario, n_batches: int = 2, batch: int = 16):
    """eval_fn for a synthetic-lm TorchLearner: next-token accuracy on a held-out stream."""
    from ..models import PRESETS
    from ..tasks.token_stream import TokenStream

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
    """Patch the simulator's learner factory and program lookup for one run (``program``
    in place of the strategy's, where given): yields a dict that holds, after the run,
    ``learners``, ``flops`` (per rank) and ``by_name`` (FLOPs per Compute op name)."""
    import oresearcher.sim.simulate as S

    got = {"learners": [], "flops": {}, "by_name": {}}
    make, get = S.make_learner, S.get_program

    def make_learner(scenario, rank, **kw):
        learner = make(scenario, rank, **kw)
        if scenario.task.language_model:
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
    from ..sim.simulate import simulate

    with instrumented(program) as got:
        report, _ = simulate(scenario, mode="numeric")
    return report, got["learners"], sum(got["flops"].values()), got["by_name"]


def metric_of(learner) -> float:
    return float(learner.evaluate()["metric"])


def averaged_metric(learners) -> float:
    """Test metric of the plain average of the learners' parameters (one architecture):
    DiLoCo's / DDP's replica, the fused model."""
    return float(averaged_eval(learners)["metric"])


def averaged_eval(learners) -> dict:
    """``evaluate()`` of the plain average of the learners' parameters (:func:`averaged_metric`).
    The first learner holds it while it is scored, then gets its own parameters back."""
    first = learners[0]
    own = first.flat_params().detach().clone()
    first.set_flat_params(torch.stack([l.flat_params().detach().double() for l in learners]).mean(0).to(own.dtype))
    try:
        return dict(first.evaluate())
    finally:
        first.set_flat_params(own)
