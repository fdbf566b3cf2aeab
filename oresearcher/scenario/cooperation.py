"""The scenario's ``cooperation:`` section (roles, fusion, rewards, allocation, privacy,
replay, the trained ensemble) and ``distill:``: validated at the boundary like every
section (:mod:`oresearcher.scenario` assembles them). Units in field descriptions."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from .types import MAX_STEPS, Float, Int, Name, Strict

Mult = Annotated[Float, Field(ge=1e-3, le=1e3)]  # a multiplier of a hyperparameter (ratio)


class RolePolicySpec(Strict):
    """Role policies of the cooperative program (oresearcher.cooperation.roles)."""

    policy: Literal["dynamic", "static", "plain"] = Field(
        "dynamic", description="dynamic: re-assign roles after every fusion round; static: keep the "
        "initial mix; plain: no specialisation (every agent trains plainly and validates)")
    explorer_lr_scale: Float = Field(2.0, gt=0, le=100, description="explorer learning rate / base lr (ratio)")
    explorer_noise: Float = Field(0.01, ge=0, le=1, description="explorer parameter noise after each round, "
                                  "std relative to the parameters' RMS (0..1)")
    explorer_epsilon_scale: Float = Field(2.0, ge=1, le=100, description="explorer epsilon/temperature multiplier (>= 1)")
    optimizer_method: Literal["sam", "swa"] = Field("sam", description="optimizer role: SAM (2 passes/step) or SWA")
    sam_rho: Float = Field(0.05, gt=0, le=10, description="SAM neighbourhood radius (L2 norm of the perturbation)")
    exploit_fraction: Float = Field(0.25, ge=0, le=0.5, description="PBT truncation selection every round: the "
                                    "bottom fraction copies the top's weights, optimizer state and multipliers (0..0.5)")
    plateau_rounds: Int = Field(2, ge=1, le=1000, description="rounds over which validation-loss plateau is judged")
    plateau_tol: Float = Field(0.01, ge=0, le=1, description="relative val-loss improvement below which it is a plateau")
    divergence_factor: Float = Field(3.0, gt=1, le=1e6, description="flag an agent whose val loss exceeds this x the median")
    lr_range: tuple[Mult, Mult] = Field((0.1, 10.0), description="[lo, hi]: initial per-agent lr multipliers, "
                                          "log-uniform over the range (one per equal log stratum); PBT's "
                                          "perturbations stay in it (ratios to training.lr, 0.001..1000)")
    knob_range: tuple[Mult, Mult] = Field((0.5, 2.0), description="[lo, hi]: initial per-agent multipliers of "
                                            "the role's own knob (explorer_noise, sam_rho), log-uniform like "
                                            "lr_range, perturbed like it (ratios, 0.001..1000)")
    validation_share: Optional[Float] = Field(0.1, gt=0, le=10, description="validators score each round a "
                                              "subsample of the validation split costing this share of the "
                                              "round's training FLOPs (ratio; null: the whole split; tasks "
                                              "that cannot predict on given rows always score it whole)")
    perturb_factor: Float = Field(1.25, ge=1, le=10, description="PBT explore: a multiplier is multiplied by "
                                  "1/f or f (a fair coin) after an exploit and every round for explorers (ratio)")

    @model_validator(mode="after")
    def _ranges(self):
        for name in ("lr_range", "knob_range"):
            lo, hi = getattr(self, name)
            if not 1e-3 <= lo <= hi <= 1e3:
                raise ValueError(f"{name}: [{lo}, {hi}] must satisfy 0.001 <= lo <= hi <= 1000")
        return self


class FusionSpec(Strict):
    """Fusion rounds (oresearcher.cooperation.fusion)."""

    method: Literal["attention", "average"] = Field("attention", description="attention-weighted or plain average")
    temperature: Float = Field(0.1, gt=0, le=1e3, description="softmax temperature tau of the attention weights")
    similarity_weight: Float = Field(0.5, ge=0, le=100, description="weight of parameter similarity in score_ij")
    outer: Literal["none", "nesterov"] = Field("none", description="outer optimizer on the fusion pseudo-gradient")
    outer_lr: Float = Field(0.7, gt=0, le=10, description="outer Nesterov learning rate (DiLoCo: 0.7)")
    outer_momentum: Float = Field(0.9, ge=0, lt=1, description="outer Nesterov momentum (DiLoCo: 0.9)")


class RewardSpec(Strict):
    """Multi-objective reward schedule (oresearcher.tasks.rewards)."""

    schedule: Literal["constant", "linear", "cosine"] = Field("cosine", description="novelty-weight schedule")
    novelty_boost: Float = Field(0.5, ge=0, le=1, description="novelty weight is x(1+b) at the start, x(1-b) at the end")
    shape_loss: bool = Field(True, description="supervised tasks: the scheduled reward also shapes the training "
                             "loss (the peer term below, soft safety rule); RL tasks always optimise the "
                             "shaped return")
    peer_term: Literal["agreement", "diversity", "none"] = Field(
        "none", description="supervised tasks' peer term of the shaped loss. agreement: KL(peers' mean "
        "prediction || own), co-distillation toward the peers' stale ensemble; diversity: minus the novelty "
        "weight x TV to the peers' mean (pushes agents apart); none (default: at equal compute the peers' "
        "forwards buy more as training steps, docs/cooperation.md): no peer term, no peer forwards")
    agreement_weight: Float = Field(0.5, ge=0, le=100, description="weight of the agreement term at the end "
                                    "of training; it ramps up from 0 along the schedule (ratio to the "
                                    "cross-entropy's unit weight)")


class AllocationSpec(Strict):
    """Dynamic resource allocation (oresearcher.cooperation.allocation)."""

    enabled: bool = Field(True, description="re-divide each round's local steps by reward improvement")
    temperature: Float = Field(0.1, gt=0, le=1e3, description="softmax temperature over contributions "
                               "(reward improvements per round, rewards in [0, 1])")
    floor: Float = Field(0.5, ge=0, le=1, description="minimum share, as a fraction of the equal share (0..1)")
    agents_per_device: Int = Field(1, ge=1, le=64, description="agents each rank (device) hosts and switches "
                                   "between; > 1 hands out device time by shares (oresearcher.cooperation.scheduler)")


class PrivacySpec(Strict):
    """Differentially private gradient sharing (oresearcher.cooperation.privacy): DP-SGD in every agent."""

    enabled: bool = Field(False, description="clip per-sample gradients and add Gaussian noise before sharing")
    clip_norm: Float = Field(1.0, gt=0, le=1e6, description="C: per-sample gradient L2 norm bound (gradient units)")
    noise_multiplier: Optional[Float] = Field(None, ge=0, le=1e4, description="sigma: noise std / C (ratio); "
                                              "set this or target_epsilon")
    target_epsilon: Optional[Float] = Field(None, gt=0, le=1e4, description="epsilon to spend in training.steps "
                                            "steps; picks sigma (opacus get_noise_multiplier)")
    delta: Float = Field(1e-5, gt=0, lt=1, description="delta of the (epsilon, delta) guarantee (probability)")
    accountant: Literal["rdp", "prv"] = Field("rdp", description="opacus accountant: rdp or prv")
    dataset_size: Optional[Int] = Field(None, ge=1, le=10**12, description="samples of each agent's private data "
                                        "(sample rate = batch / size); default: the task's training split")

    @model_validator(mode="after")
    def _one_noise_source(self):
        if self.noise_multiplier is not None and self.target_epsilon is not None:
            raise ValueError("set noise_multiplier or target_epsilon, not both")
        if self.enabled and self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("privacy is enabled: set noise_multiplier or target_epsilon")
        return self


class ReplaySpec(Strict):
    """A prioritized replay pool shared by all agents (oresearcher.cooperation.replay, oresearcher.cooperation.replay_sharing)."""

    enabled: bool = Field(False, description="agents share one prioritized replay pool (cartpole: "
                          "transitions; digits: hard examples, priority = loss)")
    capacity: Int = Field(100_000, ge=1, le=10**8, description="entries (transitions) in the pool; the oldest "
                          "are evicted first")
    alpha: Float = Field(0.6, ge=0, le=10, description="prioritization exponent: P(i) ~ p_i^alpha (0: uniform)")
    beta_start: Float = Field(0.4, ge=0, le=1, description="importance-weight exponent at step 0, annealed "
                              "linearly to 1 at training.steps")
    sync_every: Int = Field(10, ge=1, le=MAX_STEPS, description="local steps between sharing rounds (one "
                            "all-gather of new rows and priority updates)")
    quota: Int = Field(64, ge=1, le=10**6, description="rows one agent may add per sharing round; older "
                       "ones beyond it are dropped")
    apex_epsilon: bool = Field(True, description="Ape-X exploration: fixed per-agent epsilons 0.4^(1+7i/(N-1)), "
                               "the largest to explorers, instead of the decaying schedule")


class EnsembleSpec(Strict):
    """The attention ensemble over the agents' outputs (oresearcher.cooperation.ensemble), supervised tasks."""

    train: bool = Field(False, description="fit it on the validation split at every fusion round; the novelty "
                        "reward and the distillation teacher use it (false: the plain mean of the agents' "
                        "log-probabilities)")
    heads: Int = Field(8, ge=1, le=64, description="attention heads over the agent axis")
    d_model: Int = Field(16, ge=1, le=4096, description="width the agents' outputs are projected to; a multiple "
                         "of heads")
    epochs: Int = Field(50, ge=1, le=100_000, description="full-batch AdamW steps per fit")
    lr: Float = Field(0.03, gt=0, le=10, description="AdamW learning rate of the fit")

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        return self


class DistillSpec(Strict):
    """One deployable model from the cluster (oresearcher.cooperation.distill): after cooperative
    training a student is distilled from the trained ensemble; ``run --export`` saves it."""

    student: Optional[Name] = Field(None, description="the student's model name (a model of workload.task); "
                                    "unset: no distillation phase")
    init: Literal["auto", "fused", "fresh"] = Field(
        "auto", description="the student's starting weights. auto: the fused model (the plain mean of the healthy "
        "final agents of its architecture) where an agent has the student's architecture, else a fresh "
        "initialisation; fused: always the fused model (an error if no agent has the architecture); fresh: "
        "always a fresh initialisation (plain distillation)")
    steps: Int = Field(200, ge=1, le=MAX_STEPS, description="distillation steps (the task data split over ranks)")
    lr: Float = Field(0.003, gt=0, le=10, description="student AdamW learning rate")
    temperature: Float = Field(4.0, gt=0, le=100, description="softmax temperature of the soft targets")
    alpha: Float = Field(0.7, ge=0, le=1, description="weight of the soft-target term; 1 - alpha weighs the "
                         "task loss (cross-entropy on the labels)")


class CooperationSpec(Strict):
    """Options of the cooperative O-Researcher program (training.strategy = oresearcher)."""

    roles: RolePolicySpec = Field(default_factory=RolePolicySpec)
    fusion: FusionSpec = Field(default_factory=FusionSpec)
    rewards: RewardSpec = Field(default_factory=RewardSpec)
    allocation: AllocationSpec = Field(default_factory=AllocationSpec)
    ensemble: EnsembleSpec = Field(default_factory=EnsembleSpec)
    privacy: PrivacySpec = Field(default_factory=PrivacySpec)
    replay: ReplaySpec = Field(default_factory=ReplaySpec)
