"""One deployable model out of the cluster: distil the trained ensemble into a student.

After cooperative training (``training.strategy: oresearcher`` with ``distill.student``
set) every rank runs a distillation phase, data parallel over all ranks:

1. The teacher: the attention ensemble fitted on the final agents
   (:mod:`oresearcher.cooperation.ensemble`; the plain mean of their log-probabilities when
   ``cooperation.ensemble.train`` is off). Each rank computes the teacher's logits once
   on its shard of the training split (samples ``rank::world``): one forward pass of every
   healthy agent plus the ensemble, charged as Compute.
2. The student (``distill.student``, a model of the task) starts, the same on every
   rank, from the fused model where an agent has its architecture (``distill.init: auto``:
   the plain mean of those healthy final agents, :func:`fused_params`; so the deployed
   model is what cooperative training produced, trained on) and from one seeded
   initialisation otherwise (a smaller or heterogeneous student). The teacher labels only
   as many rows of the shard as the student will draw (:func:`label_rows`). Each step
   draws a batch of ``workload.global_batch / world`` from those rows and minimises
   Hinton et al.'s loss ("Distilling the Knowledge in a Neural Network", 2015),

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
distill.student=gpt-125m`` predicts what distilling the cluster costs.

Resuming: the phase has no resume boundary of its own (it is short next to training). A run
stopped during it resumes at the end of cooperative training and distils again, to the
same student: the checkpoint of that boundary carries the final agents (their parameters
in the learners, the rest in :class:`FinalAgents`), the trained ensemble and the replay
pool; the student starts from the same fused or seeded weights and draws from seeded generators.

The shared replay pool (``cooperation.replay``, a supervised task's hard-example pool with
``x`` and ``y`` columns): frozen at the end of training, its rows (this rank's share,
``rank::world``) get teacher outputs too, and a ``learner.hard_fraction`` of every
distillation batch is drawn from them in proportion to their priorities, as training drew
its hard examples; the rest comes from the task data.
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
from ..seeds import STREAM, derive


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, temperature: float,
            alpha: float) -> torch.Tensor:
    """alpha * T^2 * KL(p_t^T || p_s^T) + (1 - alpha) * CE(s, y), batch mean."""
    t = temperature
    soft = F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), log_target=True,
                    reduction="batchmean") * (t * t)
    return alpha * soft + (1.0 - alpha) * F.cross_entropy(student, labels)


def build_student(task: str, arch: str, seed: int, init: torch.Tensor | None = None) -> torch.nn.Module:
    """The task's ``arch`` model from one seeded initialisation, off the global generator;
    with ``init`` (flat parameters, e.g. :func:`fused_params`) it holds exactly those."""
    from ..tasks import TASKS

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive(seed, 4_242, prime=STREAM))
        module = importlib.import_module(TASKS[task]).build_model(arch)
    if init is not None:
        numel = sum(p.numel() for p in module.parameters())
        with torch.no_grad():
            dtype = next(module.parameters()).dtype
            torch.nn.utils.vector_to_parameters(init.reshape(-1)[:numel].to(dtype), module.parameters())
    return module


def fused_params(flats, ids, excluded, arch: str) -> torch.Tensor | None:
    """The fused model of architecture ``arch``: the plain mean of its healthy final agents'
    flat parameters (what fusion converges to; the cooperative program's deployable model
    where the student shares the agents' architecture). None when no healthy agent has it."""
    rows = [f.reshape(-1).double() for f, a, x in zip(flats, ids, excluded) if a == arch and not x]
    return torch.stack(rows).mean(0) if rows else None


def student_init(scenario, res: dict):
    """The student's starting flat parameters (``distill.init``), or None: a fresh one."""
    d = scenario.distill
    if d.init == "fresh":
        return None
    return fused_params(res["flats"], res["ids"], res["excluded"], d.student)


def label_rows(total: int, steps: int, batch: int, seed: int) -> torch.Tensor:
    """Rows of a rank's shard the teacher labels: a seeded subset of ``min(total, steps *
    batch)`` rows, so the student trains on at least as many samples as the teacher labels
    (labelling rows the student never draws is compute that buys nothing)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(total, generator=g)[:min(total, steps * batch)].sort().values


class Student:
    """The student, its optimizer and its data: the shard ``(X, y)`` with teacher logits."""

    def __init__(self, module, X, y, teacher, *, batch: int, lr: float, temperature: float, alpha: float,
                 seed: int, pool=None):
        self.module, self.X, self.y, self.teacher = module, X, y, teacher
        self.batch, self.temperature, self.alpha = min(batch, len(X)), temperature, alpha
        self.opt = torch.optim.AdamW(module.parameters(), lr=lr)
        self.g = torch.Generator().manual_seed(seed)
        # pool: (X, y, teacher, weights, k): k of every batch's rows drawn from it by weight
        self.pool = pool if pool is not None and pool[4] > 0 else None
        fwd, bwd, _ = measure_module(module, (X[:self.batch],), lambda o: F.cross_entropy(o, y[:self.batch]))
        self.step_flops = float(fwd + bwd)

    def draw(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One batch: (inputs, labels, teacher logits), part from the pool if there is one."""
        k = self.pool[4] if self.pool is not None else 0
        idx = torch.randint(len(self.X), (self.batch - k,), generator=self.g)
        x, y, t = self.X[idx], self.y[idx], self.teacher[idx]
        if k:
            Xp, yp, tp, w, _ = self.pool
            j = torch.multinomial(w, k, replacement=True, generator=self.g)
            x, y, t = torch.cat([x, Xp[j]]), torch.cat([y, yp[j]]), torch.cat([t, tp[j]])
        return x, y, t

    def forward_backward(self) -> dict:
        x, y, t = self.draw()
        self.module.train()
        loss = kd_loss(self.module(x), t.to(x.device), y, self.temperature, self.alpha)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        return {"distill_loss": float(loss.detach())}

    def flat_grad(self) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in self.module.parameters()])

    def apply(self, flat: torch.Tensor) -> None:
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in self.module.parameters()])
        self.opt.step()


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
    if distilling and not all(hasattr(learner, a) for a in ("predict_params", "task_data", "n_classes")):
        raise UserError(f"distill.student: task {ctx.scenario.workload.task} cannot be distilled with real values "
                        "yet (a supervised task whose learner has predict_params and task_data: digits)")
    final = ctx.register("distill_final", FinalAgents()) if distilling else None

    def on_step(op):  # the first StepDone after _final: the boundary a resumed run starts from
        res = getattr(learner, "cooperative_result", None)
        if final is not None and res and not final.data:
            final.capture(res, count)
    result = yield from _counted(cooperative(ctx, learner), count, on_step)
    if distilling and not getattr(learner, "cooperative_result", None) and final.data:
        result = yield from _final_agents(ctx, learner, final, count)
    if distilling and getattr(learner, "cooperative_result", None):
        yield from _counted(distill(ctx, learner, count["last_step"] + 1, count), count)
    elif ctx.scenario.distill.student and not ctx.numeric and ctx.scenario.workload.task == "synthetic-lm":
        yield from distill_shape(ctx, learner, count["last_step"] + 1)
    return result


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
    from ..programs.cooperative_round import gather_params

    flats = yield from gather_params(ctx, learner, final.data["pad_to"])
    learner.cooperative_result = {**{k: final.data[k] for k in FinalAgents.KEYS}, "flats": flats}
    count.update(flops=final.data["flops"], last_step=final.data["last_step"])
    return learner.cooperative_result


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
    batch = min(max(1, sc.workload.global_batch // n), len(X))
    rows = label_rows(len(X), d.steps, batch, derive(sc.seed, rank, 4_243, prime=STREAM)).to(X.device)
    X, y = X[rows], y[rows]
    teacher = yield from _teacher(ctx, learner, ens, X)
    pool = replay_rows(ctx.state.get("replay"), rank, n, X)
    if pool is not None:  # the shared hard-example pool's rows, with their teacher outputs
        k = round(float(getattr(learner, "hard_fraction", 0.25)) * batch)
        pool = (*pool[:2], (yield from _teacher(ctx, learner, ens, pool[0])), pool[2], min(k, batch - 1))
    init = student_init(sc, learner.cooperative_result)
    module = build_student(sc.workload.task, d.student, sc.seed, init).to(X.device, X.dtype)
    student = Student(module, X, y, teacher, batch=batch, lr=d.lr, temperature=d.temperature, alpha=d.alpha,
                      seed=derive(sc.seed, rank), pool=pool)
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
    metrics.update(student_from_fused=float(init is not None))
    learner.distill_result = {"module": module, "arch": d.student, "metrics": dict(metrics)}
    yield StepDone(first_step + d.steps - 1, metrics)


def replay_rows(shared, rank: int, n: int, X: torch.Tensor):
    """(inputs, labels, sampling weights) of this rank's share (``rank::n``) of the shared
    replay pool's filled rows, or None: no pool, an empty share, or a pool that does not
    hold supervised ``x``/``y`` rows. Weights are the stored priorities (p^alpha), as the
    pool samples them."""
    pool = getattr(shared, "pool", None)
    if pool is None or len(pool) == 0 or not {"x", "y"} <= set(pool.columns):
        return None
    rows = torch.arange(len(pool))[rank::n]
    if rows.numel() == 0:
        return None
    w = torch.as_tensor(pool.priorities(), dtype=torch.float64)[rows]
    x = pool.columns["x"][rows].to(X.device, X.dtype).reshape(len(rows), *X.shape[1:])
    return x, pool.columns["y"][rows].to(X.device), w


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
    g = torch.Generator().manual_seed(derive(scenario.seed, 77))
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
