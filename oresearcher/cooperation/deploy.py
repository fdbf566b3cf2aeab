"""The model a cooperative run deploys, and ``run --export`` of it.

With ``distill.student`` set the deployed model is the student
(:mod:`oresearcher.cooperation.distill`). Without one it is the fused group: for each
architecture, the plain mean of its healthy final agents' parameters
(:func:`~oresearcher.cooperation.distill.fused_params`, what fusion converges to; agents
of different architectures cannot be averaged into one). A run whose agents share one
architecture exports one model into the ``--export`` directory; a heterogeneous run
(e.g. scenarios/finance.yaml: credit_data, HMDA and volatility agents) exports one per
architecture, into ``DIR/<architecture>``. Each loads with
:func:`oresearcher.export.load_model`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and the programs load when a model is built, not when a CLI checks its flags
    import torch


def exportable(scenario) -> str | None:
    """Why ``run --export`` cannot save this scenario's deployed model (one line), or None."""
    from ..strategies import all_strategies

    sc = scenario
    if not sc.strategy.cooperative:
        coop = " or ".join(s.name for s in all_strategies() if s.cooperative)
        return (f"--export saves the deployed model of a cooperative run (training.strategy={coop}); "
                f"this run's strategy is {sc.training.strategy}")
    if sc.distill.student:
        return None
    if sc.cooperation.allocation.agents_per_device > 1:
        return ("--export: with cooperation.allocation.agents_per_device > 1 the agents are not fused into one "
                "model at the end; set distill.student to deploy a distilled one")
    if sc.task.build_model is None:
        from ..tasks import TASKS, get_task

        able = " and ".join(n for n in TASKS if get_task(n).build_model is not None)
        return (f"--export: task {sc.workload.task} has no exportable model (safetensors + JSON export covers "
                f"the {able} models)")
    return None


def architectures(ids) -> list[str]:
    """The agents' architectures, each once, in rank order."""
    return list(dict.fromkeys(ids))


def fused_modules(scenario, result: dict) -> dict:
    """{architecture: the fused model (an nn.Module on the CPU, float32 as the task builds it)}
    of a finished cooperative run's ``learner.cooperative_result``; an architecture whose
    agents were all excluded has none."""
    from .distill import build_student, fused_params

    out = {}
    for arch in architectures(result["ids"]):
        flat = fused_params([f.detach().cpu() for f in result["flats"]], result["ids"], result["excluded"], arch)
        if flat is not None:
            out[arch] = build_student(scenario.workload.task, arch, scenario.seed, flat).eval()
    return out


def save(directory, module: "torch.nn.Module", scenario, arch: str, metrics: dict | None = None) -> Path:
    """One model of ``scenario``'s task into ``directory`` (oresearcher.export)."""
    from ..tasks import export as X

    task = scenario.task
    return X.save_model(directory, module, task=task.name, architecture=arch,
                        preprocessing=task.inputs(arch), n_classes=X.classes_of(task, module),
                        metrics=metrics, scenario=scenario.name)


def export_fused(scenario, result: dict, directory, metrics: dict | None = None) -> list[Path]:
    """Save the fused model(s) (module doc); ``metrics``: {architecture: {name: value}}
    written beside each. Returns the directories written."""
    modules = fused_modules(scenario, result)
    several = len(architectures(result["ids"])) > 1
    return [save(Path(directory) / arch if several else directory, m, scenario, arch, (metrics or {}).get(arch))
            for arch, m in modules.items()]
