"""Roles of *sharded* agents (``fsdp.replicas: fusion`` with ``agents.roles``), as ops.

Each sharded agent is an FSDP group of S ranks (:mod:`oresearcher.cooperation.sharded_fusion`);
``agents.roles`` gives the mix over those agents (it adds up to agents.count / S), in the
order of :func:`oresearcher.cooperation.roles.initial_roles`: explorers first, then
optimizers, then validators. The roles are those of :mod:`oresearcher.cooperation.roles`,
made to work on shards:

- **explorer**: trains with lr x ``cooperation.roles.explorer_lr_scale``; after each fusion
  round every rank adds Gaussian noise to *its own shard* (:func:`roles.param_noise`: std
  ``explorer_noise`` x the RMS of that shard), from a generator seeded by (scenario seed,
  round, rank), so a resumed run draws the same noise and no state is checkpointed.
- **optimizer**: Sharpness-Aware Minimization (Foret et al., ICLR 2021) on the sharded
  model: forward-backward, ascend to w + rho g/||g||, forward-backward again on the same
  batch, step from w with that gradient. ||g|| is the norm of the agent's whole gradient:
  each rank sums the squares of its gradient shard and the agent's ranks all-reduce that
  one number (FSDP2 has already reduce-scattered the gradient, so the shards are the
  agent's averaged gradient). Two sharded passes: the simulator charges two schedules.
- **validator**: trains plainly. The unsharded program's validators score everyone on
  held-out data; here every agent scores itself on the shared held-out set, split over
  its ranks (:mod:`oresearcher.cooperation.sharded_validation`), since scoring another
  agent would need its whole model. So no validator is needed and none is forced into
  the mix.

``cooperation.roles.policy``: ``static`` keeps the mix for the whole run; ``plain`` trains
every agent plainly; ``dynamic`` re-assigns the roles after every round with the unsharded
program's pure functions, identically on every rank since they see the same gathered
held-out losses: difficulty (:func:`roles.difficulty`: plateau of the best held-out loss,
spread of the scores exp(-loss)) sets the share of explorers, the best-scoring agents
optimize, and :func:`roles.assign_roles` keeps at least one validator, as there. Its state
(the roles and the loss history) is checkpointed with each rank. The simulator sees no
losses (shape mode), so it prices the initial roles. PBT exploit/explore and lr jitter are
not applied to sharded agents.
"""
from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..models.sharding import local_part
from ..ops import AllReduce, Compute
from ..seeds import RANK, STREAM, derive
from .roles import ROLE_CODES, assign_roles, difficulty, param_noise

log = logging.getLogger(__name__)


def agent_roles(scenario) -> Optional[list[str]]:
    """The role of each sharded agent (fixed for the run), or None: every agent trains plainly."""
    mix = scenario.agents.roles
    if (not scenario.strategy.sharded_agents(scenario) or mix is None
            or scenario.cooperation.roles.policy == "plain"):
        return None
    return ["explorer"] * mix.explorer + ["optimizer"] * mix.optimizer + ["validator"] * mix.validator


def noise_generator(seed: int, rnd: int, rank: int) -> torch.Generator:
    """The explorer noise of fusion round ``rnd`` on ``rank``'s shard (one stream per rank and round)."""
    return torch.Generator().manual_seed(derive(seed, rnd, rank, prime=(STREAM, RANK)))


# ---- the math on this rank's shards (real runs) ------------------------------------------

def _local(tensors) -> list[torch.Tensor]:
    return [local_part(t) for t in tensors]


@torch.no_grad()
def grad_sq_norm(learner) -> torch.Tensor:
    """[1] float64: the sum of squares of this rank's gradient shards."""
    grads = _local(p.grad for p in learner.params if p.grad is not None)
    return torch.stack([g.to(torch.float64).pow(2).sum() for g in grads]).sum().reshape(1)


@torch.no_grad()
def sam_ascend(learner, sq_norm: torch.Tensor, rho: float) -> list[torch.Tensor]:
    """w <- w + rho g/||g|| on this rank's shards (||g||^2 = ``sq_norm``, the agent's);
    returns the shards of w to restore after the second pass."""
    scale = rho / (math.sqrt(float(sq_norm.reshape(-1)[0])) + 1e-12)
    params = _local(learner.params)
    saved = [p.detach().clone() for p in params]
    for p, g in zip(params, _local(q.grad for q in learner.params)):
        if g is not None:
            p.add_(g, alpha=scale)
    return saved


@torch.no_grad()
def sam_restore(learner, saved: list[torch.Tensor]) -> None:
    """Put w back exactly (w + e - e is not w in floating point)."""
    for p, w in zip(_local(learner.params), saved):
        p.copy_(w)


class OnBatch:
    """``learner`` with a data stream that repeats ``batch``: SAM's second pass sees the
    first one's batch, through the learner's own forward_backward and checks."""

    def __init__(self, learner, batch):
        self._learner, self.batches = learner, itertools.repeat(batch)

    def __getattr__(self, name):
        return getattr(self._learner, name)

    def forward_backward(self) -> dict:
        return type(self._learner).forward_backward(self)


@dataclass
class RoleState:
    """Every agent's role and the best held-out loss of each round (checkpointed)."""

    roles: list
    history: list = field(default_factory=list)

    def state_dict(self) -> dict:
        return {"roles": list(self.roles), "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.roles, self.history = list(state["roles"]), [float(x) for x in state["history"]]


def switch_roles(state: RoleState, losses: torch.Tensor, spec, rnd: int) -> list:
    """After round ``rnd``: the new roles from the agents' held-out ``losses`` ([n]; a
    non-finite one is excluded), by roles.difficulty and roles.assign_roles; returns the
    switches."""
    lo = torch.as_tensor(losses, dtype=torch.float64)
    excluded = ~torch.isfinite(lo)
    healthy = lo[~excluded]
    state.history.append(float(healthy.min()) if healthy.numel() else float("nan"))
    scores = torch.exp(-torch.nan_to_num(lo, nan=math.inf, posinf=math.inf))
    hard, plateau, spread = difficulty(state.history, scores, excluded, spec.plateau_rounds, spec.plateau_tol)
    reason = f"round {rnd}: difficulty {hard:.2f} (plateau {plateau:.2f}, spread {spread:.2f})"
    state.roles, switches = assign_roles(state.roles, scores, excluded, hard, reason)
    return switches


# ---- the ops ------------------------------------------------------------------------------

class RoleStep:
    """One rank's role in a sharded-agents run: how it trains and what it does after fusion.

    ``role``: its agent's role (or ``state``: every agent's, with ``agent`` its index);
    ``shard_group``: the agent's ranks; ``spec``: the scenario's ``cooperation.roles``
    (policy, explorer_lr_scale, explorer_noise, optimizer_method, sam_rho, plateau_*).
    """

    def __init__(self, role: Optional[str], rank: int, shard_group, spec, seed: int,
                 state: Optional[RoleState] = None, agent: int = 0):
        self.rank, self.shard, self.spec, self.seed = rank, tuple(shard_group), spec, seed
        self.state, self.agent = state or RoleState([role]), (agent if state is not None else 0)

    @classmethod
    def build(cls, ctx, shard_group) -> Optional["RoleStep"]:
        roles = agent_roles(ctx.scenario)
        if roles is None:
            return None
        state = ctx.register("sharded_roles", RoleState(roles))  # a resume loads the roles it had
        return cls(None, ctx.rank, shard_group, ctx.scenario.cooperation.roles, ctx.scenario.seed,
                   state=state, agent=ctx.rank // len(shard_group))

    @property
    def role(self) -> str:
        return self.state.roles[self.agent]

    @property
    def sam(self) -> bool:
        return self.role == "optimizer" and self.spec.optimizer_method == "sam"

    @property
    def code(self) -> float:
        """The role as the reports' metric (roles.ROLE_CODES)."""
        return float(ROLE_CODES[self.role])

    def switch(self, losses, rnd: int) -> None:
        """``policy: dynamic``: new roles after round ``rnd`` (None losses: shape mode, keep them)."""
        if self.spec.policy != "dynamic" or losses is None:
            return
        for sw in switch_roles(self.state, losses, self.spec, rnd):
            if sw.rank == self.agent:
                log.info("rank %d (agent %d): role %s -> %s (%s)", self.rank, self.agent, sw.old, sw.new, sw.reason)

    @property
    def lr_scale(self) -> float:
        return self.spec.explorer_lr_scale if self.role == "explorer" else 1.0

    def set_lr(self, learner, base_lr: float) -> None:
        """The role's learning rate on every param group (idempotent: also after a resume)."""
        for g in learner.optimizer.param_groups:
            g["lr"] = base_lr * self.lr_scale

    def train(self, one_pass, numel: int, learner=None):
        """The forward-backward ops of one step (generator; returns the first pass's metrics).

        ``one_pass()``: a generator of one sharded forward-backward returning its metrics
        (the simulator: the FSDP schedule; a real run: the delegated Compute on a fixed
        batch); ``numel``: this rank's parameters; ``learner``: None in shape mode."""
        first = yield from one_pass()
        if not self.sam:
            return first
        sq = (torch.empty(1, dtype=torch.float64, device="meta") if learner is None
              else (yield Compute(grad_sq_norm, learner, name="sam_grad_norm")))
        if len(self.shard) > 1:
            sq = yield AllReduce(sq, group=self.shard, op="sum", name="sam_grad_norm")
        fn = (None,) if learner is None else (sam_ascend, learner, sq, self.spec.sam_rho)
        saved = yield Compute(*fn, flops=2.0 * numel, name="sam_ascend")  # w + s g: 2 FLOPs a parameter
        second = yield from one_pass()
        yield Compute(*((None,) if learner is None else (sam_restore, learner, saved)), name="sam_restore")
        first = dict(first or {})
        if second and "loss" in second:
            first["sam_loss"] = second["loss"]
        if second and "_nonfinite" in second:
            first.setdefault("_nonfinite", second["_nonfinite"])
        return first

    def after_fusion(self, flat: torch.Tensor, rnd: int):
        """Explorers: noise on this rank's fused shard (generator; returns the shard)."""
        if self.role != "explorer" or self.spec.explorer_noise <= 0:
            return flat
        if flat.device.type == "meta":
            yield Compute(flops=2.0 * flat.numel(), name="explore_noise")
            return flat
        return (yield Compute(param_noise, flat, self.spec.explorer_noise, noise_generator(self.seed, rnd, self.rank),
                              flops=2.0 * flat.numel(), name="explore_noise"))
