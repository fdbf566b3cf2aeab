"""The cooperative program's round: the state it keeps, who is in which architecture
group, how a round's steps are laid out, and the round-end exchange (parameters gathered,
validators' scores gathered, rewards). :mod:`oresearcher.programs.cooperative` drives it."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from ..cooperation import ensemble as E
from ..cooperation import roles as R
from ..cooperation import validation as V
from ..cooperation.fusion import HeterogeneousEnsemble
from ..tasks.rewards import reward, tv_novelty
from ..seeds import RANK, SMALL, STREAM, derive
from ..ops import AllGather, AllReduce, Compute, Recv, Send
from .data_parallel import reduce_buckets

log = logging.getLogger(__name__)


@dataclass
class GroupState:
    """What every rank knows about the whole group; identical on every rank."""

    roles: list
    lr_mult: list
    val_losses: list = field(default_factory=list)  # best healthy val loss per round
    rewards: list = field(default_factory=list)  # per round, one per agent
    round: int = 0
    knob_mult: list = None  # per agent, multiplies its role's own knob (explorer_noise, sam_rho)

    def __post_init__(self):
        if self.knob_mult is None:
            self.knob_mult = [1.0] * len(self.roles)

    def state_dict(self) -> dict:
        return {"roles": list(self.roles), "lr_mult": list(self.lr_mult), "knob_mult": list(self.knob_mult),
                "val_losses": list(self.val_losses), "rewards": [list(r) for r in self.rewards], "round": self.round}

    def load_state_dict(self, state: dict) -> None:
        self.roles, self.lr_mult = list(state["roles"]), list(state["lr_mult"])
        self.knob_mult = list(state.get("knob_mult", [1.0] * len(self.roles)))  # older checkpoints: none
        self.val_losses, self.rewards = list(state["val_losses"]), [list(r) for r in state["rewards"]]
        self.round = int(state["round"])


@dataclass
class LoopState:
    """Where this agent stands at a round boundary: the next round, its own StepDone
    counter (agents take different numbers of steps) and the next round's planned steps."""

    round: int = 0
    step: int = 0
    steps_now: list = field(default_factory=list)

    def state_dict(self) -> dict:
        return {"round": self.round, "step": self.step, "steps_now": list(self.steps_now)}

    def load_state_dict(self, state: dict) -> None:
        self.round, self.step = int(state["round"]), int(state["step"])
        self.steps_now = [int(x) for x in state["steps_now"]]


def arch_ids(scenario) -> list:
    archs = scenario.agents.architectures
    return list(archs) if archs else [scenario.workload.model] * scenario.world_size


def arch_group(ids: list, rank: int):
    """Ranks sharing rank's architecture; None (the world) when everyone does."""
    members = tuple(i for i, a in enumerate(ids) if a == ids[rank])
    return None if len(members) == len(ids) else members


def round_lengths(steps: int, interval: int) -> list[int]:
    """Base steps of each round: ``interval`` each, the last takes the remainder."""
    full, rest = divmod(steps, interval)
    return [interval] * full + ([rest] if rest else [])


def step_cost(role: str, method: str) -> int:
    """Compute units of one local step: a SAM step is two forward-backward passes."""
    return 2 if role == "optimizer" and method == "sam" else 1


def initial_lr_mult(seed: int, n: int, lr_range, knob_range=(1.0, 1.0)) -> tuple[list[float], list[float]]:
    """PBT's initial population: per-agent (lr multipliers, role-knob multipliers), each
    log-uniform over its range, one per stratum (:func:`oresearcher.cooperation.roles.log_uniform_strata`), seeded."""
    g = torch.Generator().manual_seed(derive(seed, 17, prime=SMALL))
    return R.log_uniform_strata(n, *lr_range, g), R.log_uniform_strata(n, *knob_range, g)


def _gen(seed: int, rnd: int, agent: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive(seed, rnd, agent, prime=(STREAM, RANK)))


def gather_params(ctx, learner, pad_to: int):
    """AllGather of every agent's flat parameters, zero-padded to ``pad_to``."""
    flat = yield Compute(learner.flat_params, name="pack")
    if flat.numel() < pad_to:
        flat = torch.cat([flat.reshape(-1), torch.zeros(pad_to - flat.numel(), dtype=flat.dtype, device=flat.device)])
    return (yield AllGather(flat, name="param_gather"))


def novelty(probs: list, ens=None) -> list[float]:
    """Each agent's TV distance to the attention ensemble of the others: the trained one
    (oresearcher.cooperation.ensemble) once it has been fitted, else the plain mean (oresearcher.cooperation.fusion)."""
    n = len(probs)
    if n < 2:
        return [0.0] * n
    if ens is not None and ens.fits:
        return E.loo_novelty(ens, probs)
    width = max(p.shape[-1] for p in probs)
    out = []
    # fork_rng: building the ensemble draws initial weights (then overwritten); keep that
    # off the global generator so tasks that use it see the same stream on every backend
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for j in range(n):
            others = [probs[k] for k in range(n) if k != j]
            ens = HeterogeneousEnsemble([p.shape[-1] for p in others], width)(others)
            out.append(float(tv_novelty(torch.nn.functional.pad(probs[j], (0, width - probs[j].shape[-1])), ens)))
    return out


def score_rows(ctx, learner, budget, agents=None):
    """The validation rows scored this round (``budget``: (FLOPs, seed) for scoring
    ``agents`` agents, default all), or None: the whole split (no budget, or a learner that
    cannot predict on given rows)."""
    per = learner.eval_flops
    if budget is None or not isinstance(per, float) or not V.can_shard(learner):
        return None
    total = len(learner.task_data("val")[1])
    size = V.subsample_size(total, budget[0], per / total, agents or ctx.world_size)
    return V.subsample_rows(total, size, budget[1])


def own_rows(ctx, learner, budget, arch):
    """Rows of ``arch``'s own validation split one agent is scored on this round, for a
    learner that scores given rows of each architecture's split (``val_size``,
    ``evaluate_params(flat, arch, rows)``): its 1/n of the budget; None: the whole split."""
    if budget is None or learner.val_size is None or "ensemble" in ctx.state:
        return None
    total = learner.val_size(arch)
    per = learner.eval_flops(arch) / total
    size = V.subsample_size(total, budget[0] / ctx.world_size, per, 1, learner.min_score_rows or V.MIN_ROWS)
    return V.subsample_rows(total, size, budget[1]) if size < total else None


def validate(ctx, learner, flats, ids, roles, train_loss, numeric, budget=None):
    """Validators score every agent, each on its own shard of the held-out split or of
    this round's subsample of it (``budget``: (FLOPs, seed), :func:`score_rows`; or one
    validator scores: :mod:`oresearcher.cooperation.validation`); everyone AllGathers the
    scores; returns Published."""
    n = ctx.world_size
    rows = None
    v, count = V.validator_slot(roles, ctx.rank)
    sub = score_rows(ctx, learner, budget) if numeric and "ensemble" not in ctx.state else None
    shards = (count > 1 or sub is not None) and V.can_shard(learner) and "ensemble" not in ctx.state
    if v >= 0 and (shards or v == 0) and numeric and learner.evaluate_params is not None:
        results = []
        for j in range(n):
            own = None if shards else own_rows(ctx, learner, budget, ids[j])
            if shards:
                res = yield Compute(V.shard_scores, learner, flats[j], ids[j], v, count, sub, name="validate")
            elif own is not None:
                res = yield Compute(learner.evaluate_params, flats[j], ids[j], own, name="validate")
            else:
                res = yield Compute(learner.evaluate_params, flats[j], ids[j], name="validate")
            yield Compute(flops=float(res.get("flops", 0.0)), name="validate")
            results.append(res)
        nov = yield Compute(novelty, [r["probs"] for r in results], ctx.state.get("ensemble"), name="novelty")
        rows = torch.tensor([[r[c] if c != "novelty" else nov[j] for c in R.REPORT_COLUMNS]
                             for j, r in enumerate(results)], dtype=torch.float64)
    dev = ctx.device if numeric else torch.device("meta")
    report = R.encode_report(rows, n, train_loss).to(dev)
    gathered = yield AllGather(report, name="score_gather")
    if not numeric:
        return None
    return R.decode_reports([g.cpu() for g in gathered], n, ctx.scenario.cooperation.roles.divergence_factor)


def round_rewards(pub, weights) -> tuple[torch.Tensor, torch.Tensor]:
    """(reliability, reward) per agent; without validator scores, from training losses."""
    if pub.columns:
        rel = pub.columns["metric"]
        rew = reward(rel, pub.columns["novelty"], pub.columns["safety"], weights)
    else:  # no held-out scorer: a bounded, decreasing function of the training loss
        rel = 1.0 / (1.0 + pub.train_loss.clamp(min=0))
        rew = reward(rel, torch.zeros_like(rel), torch.isfinite(pub.train_loss).double(), weights)
    rew = torch.where(pub.excluded, torch.full_like(rew, float("nan")), rew)
    return rel, rew


def _finite_buckets(learner) -> list:
    """The gradient buckets, zeroed if any value is non-finite: a diverged agent must not
    poison the others through gradient sharing (fusion excludes it at the round's end).
    The last bucket carries one more element, 1 if this agent's gradient is healthy, so
    the average divides by the healthy agents, not all of them (:func:`_healthy_average`)."""
    buckets = learner.grad_buckets()
    healthy = 1.0
    if buckets and buckets[0].device.type != "meta" and not all(bool(torch.isfinite(b).all()) for b in buckets):
        log.warning("non-finite gradients: this agent shares zeros until the fusion round")
        buckets, healthy = [torch.zeros_like(b) for b in buckets], 0.0
    if buckets:
        last = buckets[-1]
        buckets[-1] = torch.cat([last.reshape(-1), torch.full((1,), healthy, dtype=last.dtype, device=last.device)])
    return buckets


def _healthy_average(ctx, buckets, group, codec):
    """Average gradients over the healthy members of ``group`` only: sum / healthy count,
    the count being the sum of the members' flags (the last bucket's extra element).
    With a codec the flags travel in their own exact all-reduce (a compressed element
    would not count exactly)."""
    if not buckets:
        return []
    if codec is None:
        reduced = yield from reduce_buckets(ctx, buckets, group, None, name="grad_share")
        frac = reduced[-1][-1:]  # mean of the flags: healthy / members
        reduced[-1] = reduced[-1][:-1]
    else:
        flags = buckets[-1][-1:].clone()
        buckets = buckets[:-1] + [buckets[-1][:-1]]
        reduced = yield from reduce_buckets(ctx, buckets, group, codec, name="grad_share")
        frac = yield AllReduce(flags, group=group, op="avg", name="healthy_count")
    if frac.device.type == "meta":
        return reduced
    f = float(frac.reshape(-1)[0])
    return [b / f for b in reduced] if f > 0 else reduced


def _exploit_optimizer_state(ctx, learner, pairs):
    """PBT exploit copies the winner's optimizer state too (a Send from the winner, a Recv
    by the loser; the same pairs on every rank). Learners without a torch optimizer
    (shape mode, foreign tasks) have none to copy."""
    if learner.optimizer is None or not learner.params:
        return
    for loser, winner in pairs:
        if ctx.rank == winner:
            yield Send((yield Compute(R.optimizer_state_flat, learner, name="pack")), dst=loser, name="exploit_state")
        elif ctx.rank == loser:
            mine = yield Compute(R.optimizer_state_flat, learner, name="pack")
            theirs = yield Recv(mine, src=winner, name="exploit_state")
            yield Compute(R.load_optimizer_state_flat, learner, theirs, name="unpack")
