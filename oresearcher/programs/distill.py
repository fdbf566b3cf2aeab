"""The distillation phase as a program: ``training.strategy: oresearcher`` runs the
cooperative program, then (with ``distill.student``) distils the group into one student.
The loss, the student, its evaluation and the same-compute comparison are
:mod:`oresearcher.cooperation.distill`; its module doc describes the phase.

Everything is ops, so the simulator prices the phase from its Compute FLOPs and the
AllReduce sizes, and the real backends run it. In shape mode (language-model presets on
a simulated cluster, no values) :func:`distill_shape` issues the same costs with the
teacher computed on the fly, so ``python -m oresearcher.sim scenarios/8xA100.yaml --set
distill.student=gpt-125m`` predicts what distilling the cluster costs.

Resuming: the phase has no resume boundary of its own (it is short next to training). A run
stopped during it resumes at the end of cooperative training and distils again, to the
same student: the checkpoint of that boundary carries the final agents (their parameters
in the learners, the rest in :class:`FinalAgents`), the trained ensemble and the replay
pool; the student starts from the same fused or seeded weights and draws from seeded generators.
"""
from __future__ import annotations

import torch

from ..cooperation import ensemble as E
from ..cooperation.distill import Student, build_student, evaluate, label_rows, replay_rows, student_init
from ..errors import UserError
from ..models.learner import DTYPES
from ..models.workloads import bucket_sizes, measure_lm, per_rank_batch
from ..ops import AllReduce, Compute, StepDone, tap
from ..seeds import STREAM, derive
from .cooperative import cooperative
from .cooperative_exchange import arch_ids, gather_params


class FinalAgents:
    """What the distillation phase needs from the end of cooperative training, saved with
    the checkpoint of that boundary (registered as "distill_final"): the agents'
    architectures and exclusions, the padded length of their gathered parameters, this
    rank's FLOPs and last StepDone. The parameters themselves are the learners' own
    (restored by the checkpoint) and are gathered again on resume."""

    KEYS = ("ids", "excluded", "roles", "reliability", "reward")

    def __init__(self):
        self.data: dict = {}

    def capture(self, result: dict, count: dict) -> None:
        self.data = {**{k: list(result[k]) for k in self.KEYS}, "pad_to": int(result["flats"][0].numel()),
                     "flops": float(count["flops"]), "last_step": int(count["last_step"])}

    def state_dict(self) -> dict:
        return dict(self.data)

    def load_state_dict(self, state: dict) -> None:
        self.data = dict(state)


def program(ctx, learner):
    """``training.strategy: oresearcher``: the cooperative program, then (with
    ``distill.student`` and real values) the distillation phase. A run resumed at the end
    of cooperative training (the last resume boundary) distils the same student as the
    uninterrupted run: the final agents come back from the checkpoint (:class:`FinalAgents`)."""
    count = {"flops": 0.0, "last_step": -1}
    distilling = bool(ctx.scenario.distill.student and ctx.numeric)
    own = ctx.scenario.task.distill_phase  # a task's own phase (text: a token-level teacher)
    if distilling and own is None and (learner.predict_params is None or learner.task_data is None
                                       or learner.n_classes is None):
        raise UserError(f"distill.student: task {ctx.scenario.workload.task} cannot be distilled with real values "
                        "yet (a supervised task whose learner has predict_params and task_data: digits)")
    final = ctx.register("distill_final", FinalAgents()) if distilling else None

    def on_step(op):  # the first StepDone after _final: the boundary a resumed run starts from
        res = learner.cooperative_result
        if final is not None and res and not final.data:
            final.capture(res, count)
    result = yield from _counted(cooperative(ctx, learner), count, on_step)
    if distilling and not learner.cooperative_result and final.data:
        result = yield from _final_agents(ctx, learner, final, count)
    if distilling and learner.cooperative_result:
        phase = (own or distill)(ctx, learner, count["last_step"] + 1, count)
        yield from _counted(phase, count)
    elif ctx.scenario.distill.student and not ctx.numeric and _presets(ctx.scenario):
        yield from distill_shape(ctx, learner, count["last_step"] + 1)
    return result


def _presets(sc) -> bool:
    """Whether the agents and the student are language-model presets (oresearcher.models.PRESETS):
    what shape mode can price a distillation phase for (synthetic-lm, text)."""
    from ..models import PRESETS

    return all(a in PRESETS for a in (*arch_ids(sc), sc.distill.student))


def _counted(gen, count: dict, on_step=None):
    """Pass ``gen``'s ops through, adding up this rank's Compute FLOPs and its last StepDone
    (``on_step(op)`` before each StepDone is yielded, i.e. before a checkpoint of it)."""
    def on_op(op):
        if isinstance(op, Compute):
            count["flops"] += float(op.flops or 0.0)
        elif isinstance(op, StepDone):
            count["last_step"] = op.step
            if on_step is not None:
                on_step(op)
    return (yield from tap(gen, on_op))


def _final_agents(ctx, learner, final: FinalAgents, count: dict):
    """Resumed after cooperative training: the final agents' parameters gathered again from
    the restored learners, the rest from the checkpoint; returns the cooperative result."""
    flats = yield from gather_params(ctx, learner, final.data["pad_to"])
    learner.cooperative_result = {**{k: final.data[k] for k in FinalAgents.KEYS}, "flats": flats}
    count.update(flops=final.data["flops"], last_step=final.data["last_step"])
    return learner.cooperative_result


def distill_shape(ctx, learner, first_step: int):
    """Shape mode (synthetic-lm presets, no values): the phase's cost only. Per step every
    agent's forward on the rank's micro batch (the teacher, computed on the fly: a token
    stream cannot be precomputed), the student's forward-backward and its gradient
    buckets all-reduced over the world, as the numeric phase issues them."""
    sc, d = ctx.scenario, ctx.scenario.distill
    w = sc.workload
    mb = per_rank_batch(sc)
    teacher = sum(measure_lm(a, mb, w.seq_len, w.dtype).fwd_flops for a in arch_ids(sc))
    student = measure_lm(d.student, mb, w.seq_len, w.dtype, w.activation_checkpointing)
    dtype = DTYPES[w.dtype]
    sizes = bucket_sizes(student.param_numels, sc.communication.bucket_bytes, torch.empty((), dtype=dtype).element_size())
    for s in range(d.steps):
        yield Compute(flops=float(teacher), name="teacher_outputs")
        yield Compute(flops=float(student.step_flops), name="distill_fwd_bwd")
        for n in sizes:
            yield AllReduce(torch.empty(n, dtype=dtype, device="meta"), op="avg", name="distill_grad")
        yield Compute(flops=10.0 * student.params, name="optimizer")
        yield StepDone(first_step + s, {})


def _teacher(ctx, learner, ens, X):
    """Generator: teacher logits [N, C] on ``X`` (every healthy final agent, then the ensemble)."""
    res = learner.cooperative_result
    probs = []
    for j, (arch, flat) in enumerate(zip(res["ids"], res["flats"])):
        if res["excluded"][j]:
            probs.append(None)
            continue
        logits, f = yield Compute(learner.predict_params, flat, arch, X, name="teacher_outputs")
        yield Compute(flops=f, name="teacher_outputs")
        probs.append(logits.softmax(-1))
    per = ens.fit_flops(1) / ((ens.epochs + 2) * (3 * 2 / 3 + 1 / 3))  # one forward of one sample
    return (yield Compute(ens.predict, probs, flops=per * len(X), name="teacher_ensemble"))


def distill(ctx, learner, first_step: int, count: dict):
    """Generator of the distillation phase (module doc); StepDones from ``first_step``;
    ``count["flops"]``: this rank's FLOPs so far (kept up to date by :func:`_counted`)."""
    sc, d, rank, n = ctx.scenario, ctx.scenario.distill, ctx.rank, ctx.world_size
    ens = ctx.state.get("ensemble") or E.from_scenario(sc, learner.n_classes)  # untrained: the plain mean
    X, y = learner.task_data("train")
    X, y = X[rank::n], y[rank::n]
    batch = min(per_rank_batch(sc), len(X))
    rows = label_rows(len(X), d.steps, batch, derive(sc.seed, rank, 4_243, prime=STREAM)).to(X.device)
    X, y = X[rows], y[rows]
    teacher = yield from _teacher(ctx, learner, ens, X)
    pool = replay_rows(ctx.state.get("replay"), rank, n, X)
    if pool is not None:  # the shared hard-example pool's rows, with their teacher outputs
        k = round(float(learner.hard_fraction) * batch)
        pool = (*pool[:2], (yield from _teacher(ctx, learner, ens, pool[0])), pool[2], min(k, batch - 1))
    init = student_init(sc, learner.cooperative_result)
    module = build_student(sc.workload.task, d.student, sc.seed, init).to(X.device, X.dtype)
    student = Student(module, X, y, teacher, batch=batch, lr=d.lr, temperature=d.temperature, alpha=d.alpha,
                      seed=derive(sc.seed, rank), pool=pool)
    for s in range(d.steps):
        metrics = yield Compute(student.forward_backward, flops=student.step_flops, name="distill_fwd_bwd")
        yield from student.averaged_update()
        if s < d.steps - 1:
            yield StepDone(first_step + s, dict(metrics, phase_distill=1.0))
    total = yield AllReduce(torch.tensor([count["flops"]], dtype=torch.float64, device=X.device), op="sum",
                            name="flops_total")
    metrics.update((yield Compute(evaluate, learner, ens, module, name="distill_eval")))
    metrics.update(phase_distill=1.0, cluster_flops=float(total.reshape(-1)[0]), student_step_flops=student.step_flops)
    metrics.update(student_from_fused=float(init is not None))
    learner.distill_result = {"module": module, "arch": d.student, "metrics": dict(metrics)}
    yield StepDone(first_step + d.steps - 1, metrics)
