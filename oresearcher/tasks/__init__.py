"""Tasks: what agents train on. Each task is one module (or folder) that declares
``TASK = Task(...)`` (:class:`oresearcher.tasks.spec.Task`): its learner factory

    make_learner(scenario, rank, *, mode, device) -> Learner

(see :mod:`oresearcher.models.learner`; ``mode`` is "shape", "numeric" or "real"), its
models and what it can do. A new task is its module plus one line in ``TASKS`` and
touches nothing else: every other module asks the :class:`Task` (``scenario.task``),
never compares the name.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models.learner import Learner
    from .spec import Task

# workload.task -> the module that declares its TASK (imported when the task is first asked for)
TASKS = {
    "synthetic-lm": "oresearcher.tasks.synthetic_lm",
    "digits": "oresearcher.tasks.digits",
    "cartpole": "oresearcher.tasks.cartpole",
    "finance": "oresearcher.tasks.finance",
    "text": "oresearcher.tasks.text",
}


def get_task(name: str) -> Task:
    """The declared :class:`~oresearcher.tasks.spec.Task` of ``workload.task`` ``name``;
    KeyError for a name that is not in ``TASKS``."""
    return importlib.import_module(TASKS[name]).TASK


def make_learner(scenario, rank: int, *, mode: str, device="cpu") -> Learner:
    return get_task(scenario.workload.task).make_learner(scenario, rank, mode=mode, device=device)


def model_names(task: str) -> tuple[str, ...]:
    """The model names ``task`` can build (its declared ``models``)."""
    return get_task(task).models


def agent_model(scenario, rank: int, mode: str, models) -> tuple[str, int]:
    """(model name, per-rank batch) of a task that trains real values: refuses shape mode
    and a model the task does not have, in one line naming the task."""
    from ..errors import UserError
    from ..models.workloads import per_rank_batch  # torch: only when a learner is built

    task = scenario.workload.task
    if mode == "shape":
        raise UserError(f"workload.task={task} runs in numeric or real mode only (simulation.mode: numeric)")
    archs = scenario.agents.architectures
    arch = archs[rank] if archs else scenario.workload.model
    if arch not in models:
        raise UserError(f"workload.model: {task} has models {', '.join(models)} (got {arch!r})")
    return arch, per_rank_batch(scenario)


def batch_note(scenario) -> str | None:
    """One line when the agents' shares do not add up to ``workload.global_batch`` (it does
    not split evenly, or there are more agents than samples), else None."""
    from ..models.workloads import per_rank_batch

    asked, agents = scenario.workload.global_batch, scenario.world_size
    per = per_rank_batch(scenario)
    if per * agents == asked:
        return None
    return (f"note: workload.global_batch {asked} over {agents} agents is {per} each: {per * agents:,} a step "
            f"(rounded {'up' if per * agents > asked else 'down'})")
