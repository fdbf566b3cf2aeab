"""Tasks: what agents train on. Each task is one module with the same small interface:

    make_learner(scenario, rank, *, mode, device) -> Learner

(see :mod:`oresearcher.models.learner`). ``mode`` is "shape", "numeric" or "real";
only synthetic-lm and text support "shape". New tasks are added to ``TASKS`` and touch nothing
else.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models.learner import Learner

TASKS = {
    "synthetic-lm": "oresearcher.tasks.synthetic_lm",
    "digits": "oresearcher.tasks.digits",
    "cartpole": "oresearcher.tasks.cartpole",
    "finance": "oresearcher.tasks.finance",
    "text": "oresearcher.tasks.text",
}


def make_learner(scenario, rank: int, *, mode: str, device="cpu") -> Learner:
    task = scenario.workload.task
    return importlib.import_module(TASKS[task]).make_learner(scenario, rank, mode=mode, device=device)


def shape_mode(task: str) -> bool:
    """Whether ``task`` can run in shape mode (its module's SHAPE_MODE: language-model presets
    priced on the meta device, no data read)."""
    return bool(getattr(importlib.import_module(TASKS[task]), "SHAPE_MODE", False))


def model_names(task: str) -> tuple[str, ...]:
    """The model names ``task`` can build (its MODELS; synthetic-lm: the transformer PRESETS)."""
    module = importlib.import_module(TASKS[task])
    return tuple(getattr(module, "MODELS", None) or getattr(module, "PRESETS"))


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
