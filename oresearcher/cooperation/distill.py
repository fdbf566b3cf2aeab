"""One deployable model out of the cluster: distil the trained ensemble into a student.

After cooperative training (``training.strategy: oresearcher`` with ``distill.student``
set) every rank runs a distillation phase, data parallel over all ranks:

1. The teacher: the attention ensemble fitted on the final agents
   (:mod:`oresearcher.cooperation.ensemble`; the plain mean of their log-probabilities when
   ``cooperation.ensemble.train`` is off). Each rank computes the teacher's logits once
   on its shard of the training split (samples ``rank::world``): one forward pass of every
   healthy agent plus the ensemble, charged as Compute.
2. The student (``distill.student``, a model of the task) starts from one seeded
   initialisation on every rank. Each step draws a batch of ``workload.global_batch /
   world`` from the shard and minimises Hinton et al.'s loss ("Distilling the Knowledge
   in a Neural Network", 2015),

       L = alpha * T^2 * KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) * CE(s, y),

   (T^2 keeps the soft term's gradient scale independent of T); gradients are averaged
   over the ranks by an AllReduce, so every rank holds the same student.
3. Evaluation on the test split, identical on every rank: the student, the ensemble, the
   best single agent. The last StepDone carries them, and the cluster's FLOPs (training
   plus distillation, summed over ranks by one AllReduce) for the same-compute baseline
   (:func:`train_alone`), which the run computes after the ranks finish.

Everything is ops, so the simulator prices the phase from its Compute FLOPs and the
AllReduce sizes, and the real backends run it. In shape mode (language-model presets on
a simulated cluster, no values) :func:`distill_shape` issues the same costs with the
teacher computed on the fly, so ``python -m oresearcher.sim scenarios/8xA100.yaml --set
distill.student=gpt-125m`` predicts what distilling the cluster costs. The phase is not a resume boundary: a run
stopped during it resumes at the end of cooperative training and distils again.
"""
from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from . import ensemble as E
from ..errors import UserError
from ..ops import AllReduce, Compute, StepDone, tap
from ..programs.cooperative import cooperative
from ..workloads import measure_module


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, temperature: float,
            alpha: float) -> torch.Tensor:
    """alpha * T^2 * KL(p_t^T || p_s^T) + (1 - alpha) * CE(s, y), batch mean."""
    t = temperature
    soft = F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), log_target=True,
                    reduction="batchmean") * (t * t)
    return alpha * soft + (1.0 - alpha) * F.cross_entropy(student, labels)


def build_student(task: str, arch: str, seed: int) -> torch.nn.Module:
    """The task's ``arch`` model from one seeded initialisation, off the global generator."""
    from ..tasks import TASKS

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 1_000_003 + 4_242)
        return importlib.import_module(TASKS[task]).build_model(arch)


class Student:
    """The student, its optimizer and its data: the shard ``(X, y)`` with teacher logits."""

    def __init__(self, module, X, y, teacher, *, batch: int, lr: float, temperature: float, alpha: float,
                 seed: int):
        self.module, self.X, self.y, self.teacher = module, X, y, teacher
        self.batch, self.temperature, self.alpha = min(batch, len(X)), temperature, alpha
        self.opt = torch.optim.AdamW(module.parameters(), lr=lr)
        self.g = torch.Generator().manual_seed(seed)
        fwd, bwd, _ = measure_module(module, (X[:self.batch],), lambda o: F.cross_entropy(o, y[:self.batch]))
        self.step_flops = float(fwd + bwd)

    def forward_backward(self) -> dict:
        idx = torch.randint(len(self.X), (self.batch,), generator=self.g)
        self.module.train()
        loss = kd_loss(self.module(self.X[idx]), self.teacher[idx].to(self.X.device), self.y[idx],
                       self.temperature, self.alpha)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        return {"distill_loss": float(loss.detach())}

    def flat_grad(self) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in self.module.parameters()])

    def apply(self, flat: torch.Tensor) -> None:
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in self.module.parameters()])
        self.opt.step()


def program(ctx, learner):
    """``training.strategy: oresearcher``: the cooperative program, then (with
    ``distill.student`` and real values) the distillation phase."""
    count = {"flops": 0.0, "last_step": -1}
    if ctx.scenario.distill.student and ctx.numeric and not all(
            hasattr(learner, a) for a in ("predict_params", "task_data", "n_classes")):
        raise UserError(f"distill.student: task {ctx.scenario.workload.task} cannot be distilled with real values "
                        "yet (a supervised task whose learner has predict_params and task_data: digits)")
    result = yield from _counted(cooperative(ctx, learner), count)
    if ctx.scenario.distill.student and ctx.numeric and getattr(learner, "cooperative_result", None):
        yield from _counted(distill(ctx, learner, count["last_step"] + 1, count), count)
    elif ctx.scenario.distill.student and not ctx.numeric and ctx.scenario.workload.task == "synthetic-lm":
        yield from distill_shape(ctx, learner, count["last_step"] + 1)
    return result


def _counted(gen, count: dict):
    """Pass ``gen``'s ops through, adding up this rank's Compute FLOPs and its last StepDone."""
    def on_op(op):
        if isinstance(op, Compute):
            count["flops"] += float(op.flops or 0.0)
        elif isinstance(op, StepDone):
            count["last_step"] = op.step
    return (yield from tap(gen, on_op))


def distill_shape(ctx, learner, first_step: int):
    """Shape mode (synthetic-lm presets, no values): the phase's cost only. Per step every
    agent's forward on the rank's micro batch (the teacher, computed on the fly: a token
    stream cannot be precomputed), the student's forward-backward and its gradient
    buckets all-reduced over the world, as the numeric phase issues them."""
    from ..programs.cooperative import arch_ids
    from ..programs.learner import DTYPES
    from ..workloads import bucket_sizes, measure_lm

    sc, d = ctx.scenario, ctx.scenario.distill
    w = sc.workload
    mb = max(1, w.global_batch // ctx.world_size)
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
    teacher = yield from _teacher(ctx, learner, ens, X)
    module = build_student(sc.workload.task, d.student, sc.seed).to(X.device, X.dtype)
    student = Student(module, X, y, teacher, batch=max(1, sc.workload.global_batch // n), lr=d.lr,
                      temperature=d.temperature, alpha=d.alpha, seed=sc.seed * 1009 + rank)
    for s in range(d.steps):
        metrics = yield Compute(student.forward_backward, flops=student.step_flops, name="distill_fwd_bwd")
        grad = yield Compute(student.flat_grad, name="pack")
        grad = yield AllReduce(grad, op="avg", name="distill_grad")
        yield Compute(student.apply, grad, flops=10.0 * grad.numel(), name="optimizer")
        if s < d.steps - 1:
            yield StepDone(first_step + s, dict(metrics, phase_distill=1.0))
    total = yield AllReduce(torch.tensor([count["flops"]], dtype=torch.float64, device=X.device), op="sum",
                            name="flops_total")
    metrics.update((yield Compute(evaluate, learner, ens, module, name="distill_eval")))
    metrics.update(phase_distill=1.0, cluster_flops=float(total.reshape(-1)[0]), student_step_flops=student.step_flops)
    learner.distill_result = {"module": module, "arch": d.student, "metrics": dict(metrics)}
    yield StepDone(first_step + d.steps - 1, metrics)


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(-1).cpu() == y.cpu()).float().mean())


@torch.no_grad()
def evaluate(learner, ens, module) -> dict:
    """Test accuracy of the student, the ensemble and the best single (healthy) agent."""
    res = learner.cooperative_result
    X, y = learner.task_data("test")
    module.eval()
    probs, agents = [], []
    for j, (arch, flat) in enumerate(zip(res["ids"], res["flats"])):
        if res["excluded"][j]:
            probs.append(None)
            continue
        logits, _ = learner.predict_params(flat, arch, X)
        probs.append(logits.softmax(-1))
        agents.append(accuracy(logits, y))
    return {"student_test_accuracy": accuracy(module(X).float(), y),
            "ensemble_test_accuracy": accuracy(ens.predict(probs), y),
            "mean_of_agents_test_accuracy": accuracy(E.EnsembleState(len(probs), learner.n_classes).predict(probs), y),
            "best_agent_test_accuracy": max(agents) if agents else float("nan")}


def train_alone(learner, scenario, steps: int, batch: int) -> float:
    """Test accuracy of the student's architecture trained alone: the same
    initialisation, plain cross-entropy on the whole training split, the student's lr,
    ``steps`` steps of ``batch`` samples."""
    d = scenario.distill
    X, y = learner.task_data("train")
    module = build_student(scenario.workload.task, d.student, scenario.seed).to(X.device, X.dtype)
    opt = torch.optim.AdamW(module.parameters(), lr=d.lr)
    g = torch.Generator().manual_seed(scenario.seed * 1009 + 77)
    module.train()
    for _ in range(steps):
        idx = torch.randint(len(X), (batch,), generator=g)
        loss = F.cross_entropy(module(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    Xt, yt = learner.task_data("test")
    module.eval()
    with torch.no_grad():
        return accuracy(module(Xt).float(), yt)


def comparison(learner, scenario) -> dict:
    """The report's ``distill`` section: the student beside the ensemble, the plain mean,
    the best single agent and the student's architecture trained alone -- on the cluster's
    whole compute (training and distillation, every rank; batch as the student's per
    rank), and for the student's steps and samples without a teacher."""
    m = learner.distill_result["metrics"]
    out = {k: float(m[k]) for k in ("student_test_accuracy", "ensemble_test_accuracy",
                                    "mean_of_agents_test_accuracy", "best_agent_test_accuracy", "cluster_flops")}
    batch = max(1, scenario.workload.global_batch // scenario.world_size)  # the student's, per rank
    steps = int(m["cluster_flops"] // m["student_step_flops"])  # what the cluster's compute buys one model
    out.update(alone_steps=float(steps), alone_test_accuracy=train_alone(learner, scenario, steps, batch),
               # as many steps and samples as the student saw, without the teacher: what distilling added
               alone_same_steps_test_accuracy=train_alone(learner, scenario, scenario.distill.steps,
                                                          batch * scenario.world_size))
    out.update(student=learner.distill_result["arch"], task=scenario.workload.task,
               ensemble_trained=bool(scenario.cooperation.ensemble.train))
    return out


def export(learner, scenario, directory):
    """Save the student (oresearcher.export) with the task's preprocessing; returns the directory."""
    from .. import export as X
    from ..tasks import TASKS

    task = importlib.import_module(TASKS[scenario.workload.task])
    res = learner.distill_result
    return X.save_model(directory, res["module"], task=scenario.workload.task, architecture=res["arch"],
                        preprocessing=dict(getattr(task, "PREPROCESSING", {})), n_classes=learner.n_classes,
                        metrics=res["metrics"], scenario=scenario.name)


def comparison_lines(section: dict) -> list[str]:
    """The comparison as printed after a run."""
    acc = lambda k: f"{section[k]:.4f}"  # noqa: E731
    ens = "trained attention ensemble" if section.get("ensemble_trained") else "ensemble (plain mean)"
    rows = [(f"student {section['student']} (distilled)", acc("student_test_accuracy")),
            (ens, acc("ensemble_test_accuracy")),
            ("plain mean of the agents", acc("mean_of_agents_test_accuracy")),
            ("best single agent", acc("best_agent_test_accuracy")),
            (f"{section['student']} alone, same compute ({section['alone_steps']:,.0f} steps)",
             acc("alone_test_accuracy")),
            (f"{section['student']} alone, the student's steps and samples", acc("alone_same_steps_test_accuracy"))]
    width = max(len(r[0]) for r in rows)
    lines = [f"one model out of the cluster: test accuracy on {section['task']} "
             f"(cluster compute {section['cluster_flops'] / 1e9:,.2f} GFLOP)"]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    if "export" in section:
        lines.append(f"exported to {section['export']} (load with oresearcher.export.load_model)")
    return lines
