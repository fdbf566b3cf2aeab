"""The scenario schema: every section's typed model (the file's reading, overrides and
errors are :mod:`oresearcher.scenario.load`).

Scenario files: parsed once, at the boundary, into validated typed models.

``load_scenario`` reads a YAML file (``scenarios/``) with a budgeted safe loader
(:mod:`oresearcher.yamlsafe`: size, alias and depth caps, no duplicate keys, no empty
file), applies ``--set path.to.field=value`` overrides and validates it; unknown keys are
errors. Every error is a :class:`~oresearcher.errors.UserError` whose one line names the
file, the field path and the bad value (at most ~200 characters of it). Every number has
a finite range (:mod:`oresearcher.scenario.types`), ``true``/``false`` are not numbers,
``name`` is a slug. Sections: here, :mod:`oresearcher.scenario.cluster` (device and
fabric names checked against the profiles), :mod:`oresearcher.scenario.cooperation`,
:mod:`oresearcher.scenario.faults`, :mod:`oresearcher.scenario.finance`. Units: sizes
carry theirs in the field name (``bucket_size_MB``, MB = 10^6 bytes); everything inside
the code is seconds, bytes, bytes/s and FLOP/s.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, NewType, Optional

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from .cooperation import CooperationSpec, DistillSpec
from ..errors import short
from ..hardware import MB
from .faults import FaultsSpec
from .convergence import ConvergenceSpec
from .cluster import ClusterSpec
from .fsdp import check_fsdp, check_role_mix
from .finance import FinanceSpec
from .types import (
    ALGORITHMS, MAX_BATCH, MAX_SEED, MAX_SEQ, MAX_STEPS, MAX_WORLD, SLUG, STRATEGIES, CodecField, Float, Int, Name,
    Strict, strategy_alias_error)


# a mapping in the file; the task's OPTIONS model once loaded (the doc page calls the type by this name)
TaskOptions = NewType("mapping", object)


class WorkloadSpec(Strict):
    task: Name = Field(
        "synthetic-lm", description="what is trained (a key of oresearcher.tasks.TASKS); synthetic-lm trains a "
                                    "model preset on random tokens"
    )
    model: Name = Field("gpt-1.3b", description="model preset (oresearcher.models.PRESETS) or task model name")
    global_batch: Int = Field(64, ge=1, le=MAX_BATCH, description="samples (sequences) per step, all agents together")
    seq_len: Int = Field(2048, ge=1, le=MAX_SEQ, description="tokens per sequence (synthetic-lm)")
    dtype: Literal["fp32", "bf16", "fp16"] = Field("bf16", description="compute and gradient dtype")
    optimizer: Literal["adamw", "sgd"] = "adamw"
    activation_checkpointing: bool = False
    options: Optional[TaskOptions] = Field(
        None, description="the task's own settings, checked against its OPTIONS model (text: corpora, "
                          "tokenizer, initial checkpoint); a task without one takes none")

    @field_validator("task")
    @classmethod
    def _known_task(cls, task):
        from ..tasks import TASKS  # the one registry: a new task is added there and nowhere else

        if task not in TASKS:
            raise ValueError(f"unknown task; known: {', '.join(TASKS)}")
        return task

    @field_validator("model")
    @classmethod
    def _known_model(cls, model, info):
        from ..tasks import model_names

        task = info.data.get("task")  # declared before model: validated first
        known = model_names(task) if task else (model,)
        if model not in known:
            raise ValueError(f"unknown model for task {task}; known: {', '.join(known)}")
        return model

    @field_validator("options")
    @classmethod
    def _task_options(cls, options, info):
        import importlib

        from ..tasks import TASKS

        task = info.data.get("task")
        spec = getattr(importlib.import_module(TASKS[task]), "OPTIONS", None) if task else None
        if spec is None:
            if options:
                raise ValueError(f"task {task} takes no options")
            return None
        if isinstance(options, spec):
            return options
        try:
            return spec.model_validate(options or {})
        except ValidationError as e:  # one line: the first problem, its path under options
            err = e.errors()[0]
            raise ValueError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


class RoleMix(Strict):
    explorer: Int = Field(0, ge=0, le=MAX_WORLD)
    optimizer: Int = Field(0, ge=0, le=MAX_WORLD)
    validator: Int = Field(0, ge=0, le=MAX_WORLD)


class AgentsSpec(Strict):
    count: Int = Field(8, ge=1, le=MAX_WORLD, description="number of agents, one rank each")
    roles: Optional[RoleMix] = Field(None, description="initial role mix; must add up to count")
    reward_weights: tuple[Annotated[Float, Field(ge=0, le=1000)], Annotated[Float, Field(ge=0, le=1000)],
                          Annotated[Float, Field(ge=0, le=1000)]] = Field(
        (0.5, 0.3, 0.2), description="weights of task, novelty and safety reward terms"
    )
    architectures: list[Name] = Field(
        default_factory=list, max_length=MAX_WORLD, description="per-agent model names for heterogeneous groups (empty: all alike)"
    )

    @field_validator("reward_weights")
    @classmethod
    def _weights(cls, w):
        if any(x < 0 for x in w) or sum(w) <= 0:
            raise ValueError("reward weights must be >= 0 with a positive sum")
        return w

    @model_validator(mode="after")
    def _architectures_fit(self):  # the role mix is checked by Scenario (sharded agents count shard groups)
        if self.architectures and len(self.architectures) != self.count:
            raise ValueError(f"{len(self.architectures)} architectures for {self.count} agents")
        return self


class CommunicationSpec(Strict):
    interval: Int = Field(100, ge=1, le=MAX_STEPS, description="steps between fusion rounds (communication_interval)")
    gradient_sharing: bool = Field(True, description="share gradients among agents of one architecture")
    share_every: Int = Field(1, ge=1, le=MAX_STEPS, description="share gradients every k steps")
    codec: CodecField = Field("none", validate_default=True, description="codec spec for shared gradients, e.g. "
                              "int8, ef(topk:0.01) (oresearcher.codecs.spec: parsed once, here)")
    bucket_size_MB: Float = Field(25.0, ge=1e-6, le=1e5, description="gradient bucket size, MB (10^6 bytes; "
                                  "at least one byte)")
    overlap: bool = Field(True, description="overlap bucketed communication with backward compute")
    algorithm: Literal[ALGORITHMS] = Field("auto", description="collective algorithm; auto picks the fastest")
    budget: Optional[Float] = Field(None, gt=0, lt=1, description="oresearcher strategy: keep exposed communication "
                                    "under this fraction of step time (oresearcher.cooperation.budget; e.g. 0.083); "
                                    "absent: share every share_every steps with the fixed codec")

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_size_MB * MB)


class TrainingSpec(Strict):
    strategy: Literal[STRATEGIES] = "oresearcher"
    steps: Int = Field(300, ge=1, le=MAX_STEPS, description="training steps per agent")
    lr: Float = Field(3e-4, gt=0, le=10, description="learning rate (above 10 is a typo)")
    local_steps: Int = Field(10, ge=1, le=MAX_STEPS, description="H for local_sgd/diloco: steps between averaging")
    checkpoint_every: Int = Field(0, ge=0, le=MAX_STEPS, description="steps between checkpoints (0: none)")
    eval_every: Int = Field(0, ge=0, le=MAX_STEPS, description="steps between held-out evaluations recorded in the "
                            "report's metrics (0: only after the last step)")
    on_divergence: Optional[Literal["stop", "skip"]] = Field(
        None, description="a non-finite loss, gradient or parameter on a rank, caught before it is shared: stop "
        "(one line naming rank and step) or skip (leave the rank's contribution out, restore its last good "
        "state); unset: skip for oresearcher, stop otherwise (oresearcher.programs.divergence)")

    @field_validator("strategy", mode="before")
    @classmethod
    def _alias(cls, name):
        why = strategy_alias_error(name)
        if why:
            raise ValueError(why)
        return name


class SimulationSpec(Strict):
    mode: Literal["auto", "shape", "numeric"] = Field(
        "auto", description="shape: meta tensors, sizes only; numeric: real values; auto: numeric for small tasks"
    )


class FsdpSpec(Strict):
    """Sharded data parallel (training.strategy = fsdp): torch FSDP2's semantics
    (oresearcher.programs.fsdp). The sharded parameters, gradients and optimizer state
    are fp32; workload.dtype is the dtype blocks are gathered and computed in."""

    reshard_after_forward: bool = Field(True, description="free each block's gathered parameters after its "
                                        "forward and gather them again for backward (ZeRO-3); false keeps them "
                                        "until backward (ZeRO-2: less communication, more memory)")
    shard_group_size: Int = Field(0, ge=0, le=MAX_WORLD, description="ranks one copy of the model is sharded "
                                  "over, consecutive ranks; the groups replicate it (HSDP). 0: every rank "
                                  "(plain FSDP). Must divide agents.count")
    reduce_dtype: Literal["compute", "fp32"] = Field("compute", description="dtype of the gradient "
                                                     "reduce-scatter: the compute dtype (workload.dtype) or fp32")
    replicas: Literal["allreduce", "fusion"] = Field("allreduce", description="what the shard groups are: "
                                                     "allreduce: replicas of one model, gradients all-reduced every "
                                                     "step (HSDP); fusion: independent sharded agents, fused shard by "
                                                     "shard every communication.interval steps "
                                                     "(cooperation.fusion: method, temperature, similarity_weight)")

    def group_size(self, world_size: int) -> int:
        """Ranks per shard group (0 means the world)."""
        return self.shard_group_size or world_size


class Scenario(Strict):
    name: str = Field("scenario", description="a slug: letters, digits, '.', '_', '-' (names the output directory)")
    seed: Int = Field(0, ge=0, le=MAX_SEED)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    agents: AgentsSpec = Field(default_factory=AgentsSpec)
    communication: CommunicationSpec = Field(default_factory=CommunicationSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    simulation: SimulationSpec = Field(default_factory=SimulationSpec)
    cooperation: CooperationSpec = Field(default_factory=CooperationSpec)
    fsdp: FsdpSpec = Field(default_factory=FsdpSpec)
    faults: FaultsSpec = Field(default_factory=FaultsSpec, description="simulated faults (oresearcher.scenario.faults)")
    distill: DistillSpec = Field(default_factory=DistillSpec)
    finance: FinanceSpec = Field(default_factory=FinanceSpec)
    convergence: Optional[ConvergenceSpec] = Field(None, description="predict the loss at scale "
                                                   "(oresearcher.scenario.convergence); absent: no prediction")
    _source: Optional[Path] = PrivateAttr(None)

    @field_validator("name", mode="before")
    @classmethod
    def _slug(cls, name):
        if not isinstance(name, str) or not SLUG.fullmatch(name):
            raise ValueError("a name is a slug of at most 64 letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit (not a path)")
        return name

    @model_validator(mode="after")
    def _known_student(self):
        from ..tasks import model_names

        student = self.distill.student
        if student is not None and student not in model_names(self.workload.task):
            raise ValueError(f"distill.student: unknown model {short(student)} for task {self.workload.task}; "
                             f"known: {', '.join(model_names(self.workload.task))}")
        archs = self.agents.architectures or [self.workload.model]
        if student is not None and self.distill.init == "fused" and student not in archs:
            raise ValueError(f"distill.init: fused, but no agent has the student's architecture {short(student)} "
                             f"(agents: {', '.join(sorted(set(archs)))})")
        return self

    @model_validator(mode="after")
    def _known_architectures(self):
        from ..tasks import model_names

        known = model_names(self.workload.task)
        bad = [a for a in self.agents.architectures if a not in known]
        if bad:
            raise ValueError(f"agents.architectures: unknown model {short(bad[0])} for task "
                             f"{self.workload.task}; known: {', '.join(known)}")
        return self

    @model_validator(mode="after")
    def _faults_fit(self):
        self.faults.check(self.world_size, self.training.strategy)
        return self

    @model_validator(mode="after")
    def _agents_fit(self):
        if self.agents.count > self.cluster.world_size:
            raise ValueError(
                f"agents.count={self.agents.count} is more than the cluster's "
                f"{self.cluster.world_size} GPUs (one agent per GPU)"
            )
        c = self.cluster
        if c.nodes > 1 and self.agents.count <= (c.nodes - 1) * c.gpus_per_node:
            # agents fill the first GPUs: a whole node left without one would be costed as absent,
            # so the report would answer for a smaller cluster than the file describes
            used = -(-self.agents.count // c.gpus_per_node)
            raise ValueError(
                f"agents.count={self.agents.count} fills {used} of the cluster's {c.nodes} nodes "
                f"({c.world_size} GPUs, one agent per GPU): set agents.count={c.world_size} or cluster.nodes={used}"
            )
        return self

    @model_validator(mode="after")
    def _privacy_fits(self):
        p, w = self.cooperation.privacy, self.workload
        if not p.enabled:
            return self
        if self.training.strategy != "oresearcher":
            raise ValueError("cooperation.privacy needs training.strategy: oresearcher")
        if self.cooperation.roles.optimizer_method == "sam":
            raise ValueError("cooperation.privacy needs cooperation.roles.optimizer_method: swa "
                             "(a SAM ascent step on the raw gradient would leak it)")
        if w.task == "cartpole":
            raise ValueError("cooperation.privacy: cartpole's replayed transitions are not a fixed private "
                             "dataset; privacy runs on supervised tasks")
        if w.task == "synthetic-lm" and p.dataset_size is None:
            raise ValueError("cooperation.privacy.dataset_size: synthetic-lm needs it for the sample rate")
        return self

    @model_validator(mode="after")
    def _fsdp_and_role_mix(self):
        check_fsdp(self)  # oresearcher.scenario.fsdp
        check_role_mix(self)
        return self

    @model_validator(mode="after")
    def _replay_fits(self):
        if not self.cooperation.replay.enabled:
            return self
        if self.training.strategy != "oresearcher":
            raise ValueError("cooperation.replay needs training.strategy: oresearcher")
        if self.workload.task not in ("cartpole", "digits"):
            raise ValueError(f"cooperation.replay: the shared pool holds cartpole transitions or digits "
                             f"samples (got workload.task {self.workload.task})")
        if self.cooperation.privacy.enabled:
            raise ValueError("cooperation.replay with cooperation.privacy: replayed samples are neither "
                             "subsampled uniformly nor private to one agent, so the accounting would not hold")
        return self

    @property
    def world_size(self) -> int:
        """Ranks in the run: one per agent (agents fill the first GPUs)."""
        return self.agents.count

    def resolved(self) -> dict:
        data = self.model_dump(mode="json")
        if data.get("convergence") is None:  # absent: reports of scenarios without it stay as they were
            data.pop("convergence", None)
        if data.get("workload", {}).get("options") is None:  # likewise for tasks without options
            data["workload"].pop("options", None)
        return data
