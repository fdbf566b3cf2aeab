"""What a task is, declared once: :class:`Task`.

Each task module (or task folder's ``__init__.py``) declares one module-level
``TASK = Task(...)``; :mod:`oresearcher.tasks` lists where tasks live and resolves
``workload.task`` to the object. Everything outside the task asks the object what the
task can do (a field below) instead of comparing its name: a new task is its module
plus one line in ``oresearcher.tasks.TASKS``, and nothing else changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Task:
    name: str  # the scenario's workload.task
    make_learner: Callable  # (scenario, rank, *, mode, device) -> Learner (oresearcher.models.learner)
    models: tuple[str, ...]  # model names the task builds (workload.model, agents.architectures, distill.student)
    shape_mode: bool = False  # can run in shape mode (meta tensors, no math); simulation.mode auto picks it
    options: Optional[type] = None  # a pydantic Strict model for workload.options (None: the section is refused)
    # a transformer preset priced per token: the per-GPU memory estimate, the roofline, measured device rates,
    # numeric mode's FLOP estimate and the held-out loss the experiments count
    language_model: bool = False
    shardable: bool = False  # training.strategy fsdp can shard its model's transformer blocks
    convergence_proxy: bool = False  # oresearcher.sim.convergence predicts its loss at scale from a numeric proxy
    # (arch) -> a fresh nn.Module: fused agents and students are built, distilled and exported (None: no export)
    build_model: Optional[Callable] = None
    preprocessing: Optional[Callable] = None  # (arch) -> dict: how a raw input becomes the model's (exports)
    n_classes: Optional[int] = None  # classes every model predicts (exports); None: read from the model's head
    replay: Optional[str] = None  # what cooperation.replay's shared pool holds of it ("samples"); None: no pool
    private_data: Optional[str] = None  # why cooperation.privacy cannot run on it; None: it can
    privacy_needs_dataset_size: bool = False  # an unbounded stream: cooperation.privacy.dataset_size sets the rate
    # the cooperative agents are compared with one model trained alone (oresearcher.programs.finance_baseline)
    single_model_comparison: bool = False
    # the task's own distillation (None: oresearcher.cooperation.distill's, for supervised learners)
    distill_phase: Optional[Callable] = None  # (ctx, learner, first_step, count) -> the phase's op program
    distill_comparison: Optional[Callable] = None  # (learner, scenario) -> the report's comparison section
    export_model: Optional[Callable] = None  # (learner, scenario, directory): the deployed model in its own format
    import_tensors: Optional[Callable] = None  # (tensors) -> tensors in build_model's names (an export read back)

    def inputs(self, arch: str) -> dict:
        """How a raw input becomes ``arch``'s (written beside an exported model); {} if undeclared."""
        return dict(self.preprocessing(arch)) if self.preprocessing else {}
