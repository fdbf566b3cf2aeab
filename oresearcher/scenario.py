"""Scenario files: parsed once, at the boundary, into validated typed models.

A scenario is a YAML file (see ``scenarios/``). ``load_scenario`` reads it with
``yaml.safe_load``, applies ``--set path.to.field=value`` overrides and validates it;
unknown keys are errors. Every error is a :class:`~oresearcher.errors.UserError` whose
one line names the file, the field path and the bad value. Nothing downstream passes raw
dicts around.

Units: sizes in the scenario carry their unit in the field name (``bucket_size_MB``,
MB = 10^6 bytes); everything inside the code is seconds, bytes, bytes/s and FLOP/s.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .errors import UserError

MB = 10**6

STRATEGIES = ("oresearcher", "ddp", "local_sgd", "diloco", "single")
ALGORITHMS = ("auto", "ring", "tree", "direct", "halving_doubling", "hierarchical")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ClusterSpec(Strict):
    nodes: int = Field(1, ge=1, le=4096, description="number of nodes")
    gpus_per_node: int = Field(8, ge=1, le=64, description="accelerators (or CPU ranks) per node")
    device: str = Field("A100-SXM4-80GB", description="device profile name (sim/profiles)")
    intra_node: str = Field("nvswitch-a100", description="fabric profile inside a node")
    inter_node: Optional[str] = Field(None, description="fabric profile between nodes (NICs + switch)")
    nics_per_node: int = Field(1, ge=1, le=64, description="network cards per node on inter_node")
    profile_files: list[str] = Field(
        default_factory=list,
        description="extra profile YAML files (e.g. from `oresearcher.calibrate`), relative to the scenario",
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @model_validator(mode="after")
    def _multi_node_needs_fabric(self):
        if self.nodes > 1 and not self.inter_node:
            raise ValueError("a cluster with more than one node needs cluster.inter_node")
        return self


class WorkloadSpec(Strict):
    task: Literal["synthetic-lm", "digits", "cartpole"] = Field(
        "synthetic-lm", description="what is trained; synthetic-lm trains a model preset on random tokens"
    )
    model: str = Field("gpt-1.3b", description="model preset (oresearcher.models.PRESETS) or task model name")
    global_batch: int = Field(64, ge=1, description="samples (sequences) per step, all agents together")
    seq_len: int = Field(2048, ge=1, description="tokens per sequence (synthetic-lm)")
    dtype: Literal["fp32", "bf16", "fp16"] = Field("bf16", description="compute and gradient dtype")
    optimizer: Literal["adamw", "sgd"] = "adamw"
    activation_checkpointing: bool = False


class RoleMix(Strict):
    explorer: int = Field(0, ge=0)
    optimizer: int = Field(0, ge=0)
    validator: int = Field(0, ge=0)


class AgentsSpec(Strict):
    count: int = Field(8, ge=1, description="number of agents, one rank each")
    roles: Optional[RoleMix] = Field(None, description="initial role mix; must add up to count")
    reward_weights: tuple[float, float, float] = Field(
        (0.5, 0.3, 0.2), description="weights of task, novelty and safety reward terms"
    )
    architectures: list[str] = Field(
        default_factory=list, description="per-agent model names for heterogeneous groups (empty: all alike)"
    )

    @field_validator("reward_weights")
    @classmethod
    def _weights(cls, w):
        if any(x < 0 for x in w) or sum(w) <= 0:
            raise ValueError("reward weights must be >= 0 with a positive sum")
        return w

    @model_validator(mode="after")
    def _roles_add_up(self):
        if self.roles is not None:
            total = self.roles.explorer + self.roles.optimizer + self.roles.validator
            if total != self.count:
                raise ValueError(f"roles add up to {total}, agents.count is {self.count}")
        if self.architectures and len(self.architectures) != self.count:
            raise ValueError(f"{len(self.architectures)} architectures for {self.count} agents")
        return self


class CommunicationSpec(Strict):
    interval: int = Field(100, ge=1, description="steps between fusion rounds (communication_interval)")
    gradient_sharing: bool = Field(True, description="share gradients among agents of one architecture")
    share_every: int = Field(1, ge=1, description="share gradients every k steps")
    codec: str = Field("none", description="codec spec for shared gradients, e.g. int8, ef(topk:0.01)")
    bucket_size_MB: float = Field(25.0, gt=0, description="gradient bucket size, MB (10^6 bytes)")
    overlap: bool = Field(True, description="overlap bucketed communication with backward compute")
    algorithm: Literal[ALGORITHMS] = Field("auto", description="collective algorithm; auto picks the fastest")

    @field_validator("codec")
    @classmethod
    def _codec_spec(cls, spec):
        from .codecs import build  # the codec library is the one authority on spec strings

        build(spec)  # ValueError names the bad part
        return spec

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_size_MB * MB)


class TrainingSpec(Strict):
    strategy: Literal[STRATEGIES] = "oresearcher"
    steps: int = Field(300, ge=1, description="training steps per agent")
    lr: float = Field(3e-4, gt=0, description="learning rate")
    local_steps: int = Field(10, ge=1, description="H for local_sgd/diloco: steps between averaging")
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints (0: none)")
    eval_every: int = Field(0, ge=0, description="steps between held-out evaluations recorded in the "
                            "report's metrics (0: only after the last step)")


class SimulationSpec(Strict):
    mode: Literal["auto", "shape", "numeric"] = Field(
        "auto", description="shape: meta tensors, sizes only; numeric: real values; auto: numeric for small tasks"
    )


class RolePolicySpec(Strict):
    """Role policies of the cooperative program (oresearcher.roles)."""

    policy: Literal["dynamic", "static", "plain"] = Field(
        "dynamic", description="dynamic: re-assign roles after every fusion round; static: keep the "
        "initial mix; plain: no specialisation (every agent trains plainly and validates)")
    explorer_lr_scale: float = Field(2.0, gt=0, le=100, description="explorer learning rate / base lr (ratio)")
    explorer_noise: float = Field(0.01, ge=0, le=1, description="explorer parameter noise after each round, "
                                  "std relative to the parameters' RMS (0..1)")
    explorer_epsilon_scale: float = Field(2.0, ge=1, le=100, description="explorer epsilon/temperature multiplier (>= 1)")
    optimizer_method: Literal["sam", "swa"] = Field("sam", description="optimizer role: SAM (2 passes/step) or SWA")
    sam_rho: float = Field(0.05, gt=0, le=10, description="SAM neighbourhood radius (L2 norm of the perturbation)")
    exploit_fraction: float = Field(0.2, ge=0, le=0.5, description="PBT exploit: bottom fraction copies the top (0..0.5)")
    plateau_rounds: int = Field(2, ge=1, le=1000, description="rounds over which validation-loss plateau is judged")
    plateau_tol: float = Field(0.01, ge=0, le=1, description="relative val-loss improvement below which it is a plateau")
    divergence_factor: float = Field(3.0, gt=1, le=1e6, description="flag an agent whose val loss exceeds this x the median")
    lr_jitter: float = Field(0.2, ge=0, le=3, description="initial per-agent lr multiplier exp(U(-j, j)) (heterogeneity)")


class FusionSpec(Strict):
    """Fusion rounds (oresearcher.fusion)."""

    method: Literal["attention", "average"] = Field("attention", description="attention-weighted or plain average")
    temperature: float = Field(0.1, gt=0, le=1e3, description="softmax temperature tau of the attention weights")
    similarity_weight: float = Field(0.5, ge=0, le=100, description="weight of parameter similarity in score_ij")
    outer: Literal["none", "nesterov"] = Field("none", description="outer optimizer on the fusion pseudo-gradient")
    outer_lr: float = Field(0.7, gt=0, le=10, description="outer Nesterov learning rate (DiLoCo: 0.7)")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="outer Nesterov momentum (DiLoCo: 0.9)")


class RewardSpec(Strict):
    """Multi-objective reward schedule (oresearcher.rewards)."""

    schedule: Literal["constant", "linear", "cosine"] = Field("cosine", description="novelty-weight schedule")
    novelty_boost: float = Field(0.5, ge=0, le=1, description="novelty weight is x(1+b) at the start, x(1-b) at the end")
    shape_loss: bool = Field(True, description="supervised tasks: the scheduled reward also shapes the training "
                             "loss (disagreement with the peer ensemble, soft safety rule); RL tasks always "
                             "optimise the shaped return")


class AllocationSpec(Strict):
    """Dynamic resource allocation (oresearcher.allocation)."""

    enabled: bool = Field(True, description="re-divide each round's local steps by reward improvement")
    temperature: float = Field(0.1, gt=0, le=1e3, description="softmax temperature over contributions "
                               "(reward improvements per round, rewards in [0, 1])")
    floor: float = Field(0.5, ge=0, le=1, description="minimum share, as a fraction of the equal share (0..1)")


class CooperationSpec(Strict):
    """Options of the cooperative O-Researcher program (training.strategy = oresearcher)."""

    roles: RolePolicySpec = Field(default_factory=RolePolicySpec)
    fusion: FusionSpec = Field(default_factory=FusionSpec)
    rewards: RewardSpec = Field(default_factory=RewardSpec)
    allocation: AllocationSpec = Field(default_factory=AllocationSpec)


class Scenario(Strict):
    name: str = "scenario"
    seed: int = Field(0, ge=0)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    agents: AgentsSpec = Field(default_factory=AgentsSpec)
    communication: CommunicationSpec = Field(default_factory=CommunicationSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    simulation: SimulationSpec = Field(default_factory=SimulationSpec)
    cooperation: CooperationSpec = Field(default_factory=CooperationSpec)
    _source: Optional[Path] = PrivateAttr(None)

    @model_validator(mode="after")
    def _agents_fit(self):
        if self.agents.count > self.cluster.world_size:
            raise ValueError(
                f"agents.count={self.agents.count} is more than the cluster's "
                f"{self.cluster.world_size} GPUs (one agent per GPU)"
            )
        return self

    @property
    def world_size(self) -> int:
        """Ranks in the run: one per agent (agents fill the first GPUs)."""
        return self.agents.count

    def resolved(self) -> dict:
        return self.model_dump(mode="json")


def parse_override(text: str, flag: str = "--set") -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a","b","c"], value parsed as YAML)."""
    if "=" not in text:
        raise UserError(f"{flag} {text!r}: expected path.to.field=value")
    path, raw = text.split("=", 1)
    if not path.strip():
        raise UserError(f"{flag} {text!r}: empty field path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path.strip().split("."), value


def apply_override(data: dict, path: list[str], value: Any, label: str) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise UserError(f"{label}: {'.'.join(path)}: {key} is not a section")
        node = child
    node[path[-1]] = value


def _format_error(source: str, err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    more = len(err.errors()) - 1
    tail = f"; and {more} more error{'s' if more > 1 else ''}" if more else ""
    return f"{source}: {loc}: {msg}{shown}{tail}"


def validate(data: Any, source: str) -> Scenario:
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise UserError(_format_error(source, e)) from None


def read_yaml(path: str | Path) -> Any:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such file")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{p}:{where}: YAML syntax error: {problem}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read: {e}") from None


def load_raw(path: str | Path, overrides: list[str] = ()) -> dict:
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    data = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        apply_override(data, keys, value, str(path))
    return data


def load_scenario(path: str | Path, overrides: list[str] = ()) -> Scenario:
    """Read, override and validate one scenario file; UserError on any problem."""
    scenario = validate(load_raw(path, overrides), str(path))
    scenario._source = Path(path)
    return scenario


def scenario_dir(scenario: Scenario) -> Path:
    """Directory that relative paths in the scenario are resolved against."""
    src = getattr(scenario, "_source", None)
    return Path(src).parent if src else Path(".")
