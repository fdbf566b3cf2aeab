"""Tasks: what agents train on. Each task is one module with the same small interface:

    make_learner(scenario, rank, *, mode, device) -> Learner

(see :mod:`oresearcher.programs.learner`). ``mode`` is "shape", "numeric" or "real";
only synthetic-lm supports "shape". New tasks are added to ``TASKS`` and touch nothing
else.
"""
from __future__ import annotations

import importlib

TASKS = {
    "synthetic-lm": "oresearcher.tasks.synthetic_lm",
    "digits": "oresearcher.tasks.digits",
    "cartpole": "oresearcher.tasks.cartpole",
    "finance": "oresearcher.tasks.finance",
}


def make_learner(scenario, rank: int, *, mode: str, device="cpu"):
    task = scenario.workload.task
    return importlib.import_module(TASKS[task]).make_learner(scenario, rank, mode=mode, device=device)


def model_names(task: str) -> tuple[str, ...]:
    """The model names ``task`` can build (its MODELS; synthetic-lm: the transformer PRESETS)."""
    module = importlib.import_module(TASKS[task])
    return tuple(getattr(module, "MODELS", None) or getattr(module, "PRESETS"))
