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

The phase as ops (the program, shape-mode pricing, resuming) is
:mod:`oresearcher.programs.distill`.

The shared replay pool (``cooperation.replay``, a supervised task's hard-example pool with
``x`` and ``y`` columns): frozen at the end of training, its rows (this rank's share,
``rank::world``) get teacher outputs too, and a ``learner.hard_fraction`` of every
distillation batch is drawn from them in proportion to their priorities, as training drew
its hard examples; the rest comes from the task data.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from . import ensemble as E
from ..models.workloads import measure_module, per_rank_batch
from ..models.flat_step import FlatGradStep
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
    from ..tasks import get_task

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive(seed, 4_242, prime=STREAM))
        module = get_task(task).build_model(arch)
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


class Student(FlatGradStep):
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
    if scenario.task.distill_comparison is not None:  # a task with its own phase and scores (text)
        return scenario.task.distill_comparison(learner, scenario)
    m = learner.distill_result["metrics"]
    out = {k: float(m[k]) for k in ("student_test_accuracy", "ensemble_test_accuracy",
                                    "mean_of_agents_test_accuracy", "best_agent_test_accuracy", "cluster_flops")}
    batch = per_rank_batch(scenario)  # the student's, per rank
    steps = int(m["cluster_flops"] // m["student_step_flops"])  # what the cluster's compute buys one model
    out.update(alone_steps=float(steps), alone_test_accuracy=train_alone(learner, scenario, steps, batch),
               # as many steps and samples as the student saw, without the teacher: what distilling added
               alone_same_steps_test_accuracy=train_alone(learner, scenario, scenario.distill.steps,
                                                          batch * scenario.world_size))
    out.update(student=learner.distill_result["arch"], task=scenario.workload.task,
               ensemble_trained=bool(scenario.cooperation.ensemble.train))
    return out


def export(learner, scenario, directory):
    """Save the student (oresearcher.tasks.export) with the task's preprocessing; returns the directory."""
    from ..tasks import export as X

    if scenario.task.export_model is not None:  # the task's own format (text: a Hugging Face directory)
        return scenario.task.export_model(learner, scenario, directory)
    res = learner.distill_result
    return X.save_model(directory, res["module"], task=scenario.workload.task, architecture=res["arch"],
                        preprocessing=scenario.task.inputs(res["arch"]), n_classes=learner.n_classes,
                        metrics=res["metrics"], scenario=scenario.name)


def comparison_lines(section: dict) -> list[str]:
    """The comparison as printed after a run."""
    if "lines" in section:  # a task that wrote its own (text)
        return list(section["lines"]) + ([f"exported to {section['export']} (load with "
                                          "oresearcher.export.load_model)"] if "export" in section else [])
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
