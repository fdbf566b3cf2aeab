"""The text task's distillation phase: the final agents teach one student, token by token.

:mod:`oresearcher.programs.distill` runs it after cooperative training (``distill.student``
set) in place of the classifier phase of :mod:`oresearcher.cooperation.distill`, whose teacher
labels a fixed set of rows once: a language model's teacher gives a distribution over the
vocabulary at every position of every window, which is computed on the fly instead.

Per step, data parallel over all ranks: each rank draws its share of the step's windows
(``workload.global_batch / world``; the ranks partition one seeded order of the agents'
training split), the teacher's log-probabilities are the mean of the healthy final agents'
log-probabilities (the plain log-linear ensemble, renormalized; the attention ensemble of
:mod:`oresearcher.cooperation.ensemble` is a classifier's), and the student minimises Hinton
et al.'s loss (:func:`token_kd_loss`) over all positions; gradients
are averaged by an AllReduce, so every rank holds the same student. The student starts from
the fused model where an agent has its architecture (``distill.init``; the deployable model is
then what cooperation produced, refined by the ensemble), else from a seeded initialisation.

At the end every rank scores the student, the teacher ensemble and (with ``init``) the base
before fine-tuning on the same validation windows and questions (:mod:`.evaluation`).
"""
from __future__ import annotations

import torch

import torch.nn.functional as F

from ...models.flat_step import FlatGradStep
from ...errors import UserError
from ...models.workloads import per_rank_batch
from ...ops import AllReduce, Compute, StepDone
from ...seeds import STREAM, derive
from . import evaluation as EV
from .model import MODELS, build_model, load_checkpoint, step_cost
from .pretrain import make_optimizer


def token_kd_loss(student: torch.Tensor, teacher_logp: torch.Tensor, targets: torch.Tensor, temperature: float,
                  alpha: float) -> torch.Tensor:
    """Hinton et al.'s loss per position, averaged over positions (``kd_loss`` of
    oresearcher.cooperation.distill over [B * T] rows): alpha * T^2 * KL(p_t^T || p_s^T)
    + (1 - alpha) * CE(s, y); student logits [N, V], teacher log-probabilities [N, V]."""
    t = temperature
    soft = F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher_logp / t, -1), log_target=True,
                    reduction="batchmean") * (t * t)
    return alpha * soft + (1.0 - alpha) * F.cross_entropy(student, targets)


def fused_start(res: dict, arch: str, mode: str):
    """The student's starting flat parameters: the plain mean of the healthy final agents of
    its architecture (``distill.init`` auto or fused; cooperation.distill.fused_params), or
    None (fresh)."""
    rows = [f.reshape(-1).double() for f, a, x in zip(res["flats"], res["ids"], res["excluded"]) if a == arch and not x]
    return torch.stack(rows).mean(0) if rows and mode != "fresh" else None


@torch.no_grad()
def teacher_logprobs(learner, members, x: torch.Tensor) -> torch.Tensor:
    """Mean log-probabilities [B, T, V] of ``members`` ([(arch, flat)]) on inputs ``x`` [B, T]."""
    total = None
    for arch, flat in members:
        lp = learner.module_with(flat, arch)(x).float().log_softmax(-1)
        total = lp if total is None else total + lp
    return (total / len(members)).log_softmax(-1)


class TextStudent(FlatGradStep):
    """The student, its optimizer and its windows; its averaged gradient clipped to norm 1."""

    clip = 1.0

    def __init__(self, module, stream, lr: float, temperature: float, alpha: float):
        self.module, self.stream = module, stream
        self.opt = make_optimizer(module, lr)
        self.temperature, self.alpha = temperature, alpha

    def forward_backward(self, x: torch.Tensor, teacher: torch.Tensor) -> dict:
        self.module.train()
        logits = self.module(x[:, :-1])
        loss = token_kd_loss(logits.flatten(0, 1).float(), teacher.flatten(0, 1), x[:, 1:].flatten(),
                             self.temperature, self.alpha)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        return {"distill_loss": float(loss.detach())}


def _student(sc, learner, res):
    d, o = sc.distill, sc.workload.options
    if d.student not in MODELS:
        raise UserError(f"distill.student: text has models {', '.join(MODELS)} (got {d.student!r})")
    init = fused_start(res, d.student, d.init)
    if d.init == "fused" and init is None:
        raise UserError(f"distill.init: fused, but no healthy agent is a {d.student}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive(sc.seed, 4_242, prime=STREAM))
        module = build_model(d.student, o.vocab_size)
    if init is not None:
        torch.nn.utils.vector_to_parameters(init.reshape(-1)[:sum(p.numel() for p in module.parameters())]
                                            .float(), module.parameters())
    return module.to(learner.device), init is not None


def phase(ctx, learner, first_step: int, count: dict):
    """Generator of the phase (module doc); StepDones from ``first_step``."""
    from .data import batches

    sc, d, rank, n = ctx.scenario, ctx.scenario.distill, ctx.rank, ctx.world_size
    w, res = sc.workload, learner.cooperative_result
    members = [(a, f) for a, f, x in zip(res["ids"], res["flats"], res["excluded"]) if not x]
    if not members:
        raise UserError("distillation: every agent was excluded (non-finite or diverging); nothing to distil")
    module, fused = _student(sc, learner, res)
    mb = per_rank_batch(sc)
    stream = batches(learner.train_data, mb, w.seq_len, seed=derive(sc.seed, 4_243, prime=STREAM), rank=rank,
                     world=n)
    student = TextStudent(module, stream, d.lr, d.temperature, d.alpha)
    o = w.options
    teacher_flops = sum(step_cost(a, o.vocab_size, mb, w.seq_len, w.dtype)[1] for a, _ in members)
    _, s_fwd, s_bwd = step_cost(d.student, o.vocab_size, mb, w.seq_len, w.dtype)
    metrics = {}
    for s in range(d.steps):
        x = next(stream).to(learner.device)
        t = yield Compute(teacher_logprobs, learner, members, x[:, :-1], flops=teacher_flops, name="teacher_outputs")
        metrics = yield Compute(student.forward_backward, x, t, flops=s_fwd + s_bwd, name="distill_fwd_bwd")
        yield from student.averaged_update()
        if s < d.steps - 1:
            yield StepDone(first_step + s, dict(metrics, phase_distill=1.0))
    total = yield AllReduce(torch.tensor([count["flops"]], dtype=torch.float64, device=learner.device), op="sum",
                            name="flops_total")
    metrics = dict(metrics)
    metrics.update((yield Compute(evaluate, learner, module, members, name="distill_eval")))
    metrics.update(phase_distill=1.0, cluster_flops=float(total.reshape(-1)[0]), student_from_fused=float(fused),
                   student_step_flops=s_fwd + s_bwd)
    learner.distill_result = {"module": module, "arch": d.student, "metrics": dict(metrics)}
    yield StepDone(first_step + d.steps - 1, metrics)


class _Ensemble(torch.nn.Module):
    """The teacher as a module (log-probabilities as logits), for the same scoring code."""

    def __init__(self, learner, members):
        super().__init__()
        self.learner, self.members = learner, members
        self.cfg = min((learner.module_with(f, a).cfg for a, f in members), key=lambda c: c.max_seq_len)

    def forward(self, x):
        return teacher_logprobs(self.learner, self.members, x)


@torch.no_grad()
def evaluate(learner, module, members) -> dict:
    """The student (``student_*``), the teacher ensemble (``ensemble_*``) and, with ``init``,
    the base before fine-tuning (``base_*``) on the validation windows and the questions."""
    sc, rows, dev = learner.scenario, learner.eval_rows, learner.device
    out = EV.scores(module, rows, learner.val_data, sc, dev, prefix="student_")
    out.update(EV.scores(_Ensemble(learner, members), rows, learner.val_data, sc, dev, prefix="ensemble_"))
    if learner.init is not None:
        base = build_model(learner.arch, sc.workload.options.vocab_size).to(dev)
        load_checkpoint(base, learner.init, learner.arch)
        out.update(EV.scores(base, rows, learner.val_data, sc, dev, prefix="base_"))
    return out


def lines(section: dict) -> list[str]:
    """What a finished run prints about its deployable model (and the report keeps)."""
    m = section
    rows = [(f"student {m['student']} (distilled, deployed)", "student_"), ("ensemble of the final agents", "ensemble_")]
    if "base_val_loss" in m:
        rows.append(("the base before fine-tuning", "base_"))
    width = max(len(r[0]) for r in rows)
    out = [f"one model out of the cluster: {m['corpus']} validation and multiple choice "
           f"(cluster compute {m['cluster_flops'] / 1e9:,.2f} GFLOP)"]
    for name, p in rows:
        out.append(f"  {name:<{width}}  {m[p + 'val_loss']:.4f} nats/token, {m[p + 'val_bits_per_byte']:.4f} "
                   f"bits/byte; multiple choice {m[p + 'mc_accuracy']:.3f} [95% CI {m[p + 'mc_ci_low']:.3f}-"
                   f"{m[p + 'mc_ci_high']:.3f}], chance {m[p + 'mc_chance']:.3f}")
    return out


def comparison(learner, scenario) -> dict:
    """The report's ``distill`` section of a text run (printed by :func:`lines`)."""
    m = learner.distill_result["metrics"]
    section = {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    section.update(student=learner.distill_result["arch"], task="text", corpus=scenario.workload.options.corpus)
    section["lines"] = lines(section)
    return section
