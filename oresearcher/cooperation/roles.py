"""Agent roles: small documented policies, chosen per agent and switched between rounds.

- **explorer**: high-risk, high-return steps. Learning rate x ``explorer_lr_scale``; after
  every fusion round Gaussian parameter noise and a PBT explore step that multiplies its
  learning-rate and knob multipliers by 1/f or f (Jaderberg et al., "Population Based
  Training of Neural Networks", 2017); where the task samples actions,
  epsilon/temperature x ``explorer_epsilon_scale``.
- **optimizer**: seeks flat regions of the loss. Sharpness-Aware Minimization (Foret et
  al., ICLR 2021): ascend to w + rho g/||g||, take the gradient there, step from w; two
  forward-backward passes on one batch, so a SAM step costs 2 compute units. Or SWA
  (Izmailov et al., "Averaging Weights Leads to Wider Optima", UAI 2018): the agent
  hands the running mean of its iterates over the round to the fusion round.
- **validator**: trains plainly and, every round, evaluates every agent on held-out
  data and publishes reliability scores (metric, loss, calibration, safety, novelty);
  flags agents whose loss is non-finite or diverging so fusion gives them weight 0.

Dynamic assignment (after each round, identical on every rank because it is a pure
function of the gathered scores): task difficulty d in [0, 1] is the mean of the
validation-loss plateau degree and the relative spread of agent scores; the agents that
are not validators become explorers in proportion to d (harder -> more explorers), the
best-scoring ones stay optimizers (refine what works), the worst explore; at least one
validator always. PBT: every agent starts from its own learning-rate and role-knob
multipliers, sampled log-uniformly over the scenario's ranges (:func:`log_uniform_strata`);
every round the bottom ``exploit_fraction`` of each architecture group copies the weights,
optimizer state and multipliers of the top (truncation selection) and perturbs them.
Every switch carries its reason.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

log = logging.getLogger(__name__)

ROLES = ("explorer", "optimizer", "validator")
ROLE_CODES = {r: i for i, r in enumerate(ROLES)}  # metrics carry the code (a scalar)
PBT_FACTORS = (0.8, 1.2)
LR_MULT_BOUNDS = (0.1, 10.0)


def initial_roles(count: int, mix=None, policy: str = "dynamic") -> list[str]:
    """Roles for ranks 0..count-1: explorers first, then optimizers, then validators.

    ``mix`` has attributes explorer/optimizer/validator (scenario RoleMix) or is None
    (default: one validator, the rest split evenly, explorers taking the odd one). A
    mix with no validator gets its last agent turned into one. ``policy="plain"``: every
    agent is a plain validator (no specialisation).
    """
    if policy == "plain":
        return ["validator"] * count
    if mix is None:
        v = 1 if count >= 1 else 0
        rest = count - v
        e, o = (rest + 1) // 2, rest // 2
    else:
        e, o, v = mix.explorer, mix.optimizer, mix.validator
    roles = ["explorer"] * e + ["optimizer"] * o + ["validator"] * v
    if count and "validator" not in roles:
        log.info("role mix has no validator; agent %d becomes the validator", count - 1)
        roles[-1] = "validator"
    return roles


def plateau_degree(losses: Sequence[float], rounds: int, tol: float) -> float:
    """How flat the recent validation loss is: 0 (improving by >= tol) .. 1 (no gain).

    Relative improvement of the best loss of the last ``rounds`` entries over the best
    before them; fewer than ``rounds + 1`` entries: not yet a plateau (0).
    """
    xs = [x for x in losses if math.isfinite(x)]
    if len(xs) <= rounds:
        return 0.0
    before, recent = min(xs[:-rounds]), min(xs[-rounds:])
    gain = (before - recent) / max(abs(before), 1e-12)
    if tol <= 0:
        return 0.0 if gain > 0 else 1.0
    return min(1.0, max(0.0, 1.0 - gain / tol))


def score_spread(scores: torch.Tensor, excluded: torch.Tensor) -> float:
    """Coefficient of variation (std / mean) of the healthy agents' scores, clipped to [0, 1]."""
    s = torch.as_tensor(scores, dtype=torch.float64)[~torch.as_tensor(excluded, dtype=torch.bool)]
    if s.numel() < 2 or float(s.mean()) <= 0:
        return 0.0
    return min(1.0, float(s.std(unbiased=False) / s.mean()))


def difficulty(losses: Sequence[float], scores, excluded, rounds: int, tol: float) -> tuple[float, float, float]:
    """(difficulty, plateau, spread): difficulty = (plateau + spread) / 2, in [0, 1]."""
    p, s = plateau_degree(losses, rounds, tol), score_spread(scores, excluded)
    return 0.5 * (p + s), p, s


def role_counts(n: int, n_validators: int, hardness: float) -> tuple[int, int, int]:
    """(explorers, optimizers, validators) for n agents at difficulty ``hardness``."""
    v = min(n, max(1, n_validators))
    rest = n - v
    e = int(round(min(1.0, max(0.0, hardness)) * rest))
    return e, rest - e, v


@dataclass
class Switch:
    rank: int
    old: str
    new: str
    reason: str


def assign_roles(prev: Sequence[str], scores, excluded, hardness: float, reason: str,
                 n_validators: Optional[int] = None) -> tuple[list[str], list[Switch]]:
    """New roles and the switches that lead there (deterministic: ties go by rank).

    Validators keep their role (their held-out history stays comparable); the others are
    ranked by score (flagged agents last): the best ``optimizers`` become optimizers, the
    rest explorers.
    """
    n = len(prev)
    n_val = sum(r == "validator" for r in prev) if n_validators is None else n_validators
    e, o, v = role_counts(n, n_val, hardness)
    s = torch.as_tensor(scores, dtype=torch.float64)
    ex = torch.as_tensor(excluded, dtype=torch.bool)
    validators = [i for i in range(n) if prev[i] == "validator"][:v]
    validators += [i for i in range(n) if i not in validators][: v - len(validators)]
    others = [i for i in range(n) if i not in validators]
    key = lambda i: (bool(ex[i]), -float(torch.nan_to_num(s[i], nan=-math.inf)), i)  # noqa: E731
    ranked = sorted(others, key=key)
    new = list(prev)
    for i in validators:
        new[i] = "validator"
    for pos, i in enumerate(ranked):
        new[i] = "optimizer" if pos < o else "explorer"
    switches = []
    for i in range(n):
        if new[i] != prev[i]:
            why = f"{reason}; {e} explorer(s), {o} optimizer(s), {v} validator(s)"
            if new[i] != "validator":
                why += f"; score rank {ranked.index(i) + 1}/{len(ranked)}" + (" (flagged)" if bool(ex[i]) else "")
            switches.append(Switch(i, prev[i], new[i], why))
    return new, switches


def exploit_pairs(scores, excluded, arch_ids: Sequence, fraction: float) -> list[tuple[int, int]]:
    """(loser, winner) pairs: in each architecture group the bottom ``fraction`` copies
    the top, k = max(1, round(fraction * m)) but at most m // 2 per group of m, and only
    where the winner scores strictly better (flagged agents score -inf)."""
    if fraction <= 0:
        return []
    s = torch.nan_to_num(torch.as_tensor(scores, dtype=torch.float64), nan=-math.inf)
    s = s.masked_fill(torch.as_tensor(excluded, dtype=torch.bool), -math.inf)
    pairs = []
    for a in sorted(set(arch_ids), key=str):
        members = [i for i, x in enumerate(arch_ids) if x == a]
        m = len(members)
        k = min(m // 2, max(1, int(round(fraction * m))))
        ranked = sorted(members, key=lambda i: (-float(s[i]), i))
        for winner, loser in zip(ranked[:k], reversed(ranked[m - k:])):
            if float(s[winner]) > float(s[loser]):
                pairs.append((loser, winner))
    return pairs


def pbt_perturb(lr_mult: float, generator: torch.Generator, bounds: Sequence[float] = LR_MULT_BOUNDS,
                factors: Sequence[float] = PBT_FACTORS) -> float:
    """PBT explore: multiply by one of ``factors`` (a fair coin from ``generator``), kept in ``bounds``."""
    f = factors[int(torch.randint(len(factors), (1,), generator=generator))]
    return min(bounds[1], max(bounds[0], lr_mult * f))


def log_uniform_strata(n: int, lo: float, hi: float, generator: torch.Generator) -> list[float]:
    """``n`` values log-uniform over [lo, hi], one in each of n equal log-width strata
    (Latin-hypercube sampling in one dimension: a small population still covers the whole
    range, which is where PBT's robustness to a mis-set hyperparameter comes from,
    Jaderberg et al. 2017); which agent gets which stratum is a seeded permutation."""
    if not 0 < lo <= hi:
        raise ValueError(f"range [{lo}, {hi}] must satisfy 0 < lo <= hi")
    a, b = math.log(lo), math.log(hi)
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    order = torch.randperm(n, generator=generator)
    return [min(hi, max(lo, math.exp(a + (b - a) * (int(order[i]) + float(u[i])) / n))) for i in range(n)]


def param_noise(flat: torch.Tensor, rel_std: float, generator: torch.Generator) -> torch.Tensor:
    """flat + N(0, (rel_std * rms(flat))^2): noise on the scale of the weights."""
    if rel_std <= 0:
        return flat
    rms = flat.float().pow(2).mean().sqrt()
    return flat + rel_std * rms * torch.randn(flat.shape, generator=generator).to(flat.dtype)


def sam_forward_backward(learner, rho: float) -> dict:
    """One SAM gradient on the next batch, left in ``p.grad`` (two passes, one batch).

    Needs a learner with ``module``, ``loss_fn``, ``batches``, ``params`` and ``optimizer``
    (TorchLearner); others fall back to their plain ``forward_backward``.
    """
    if learner.module is None or learner.optimizer is None:  # shape mode: no module to take the SAM step on
        return learner.forward_backward()
    learner.module.train()
    learner.optimizer.zero_grad(set_to_none=False)
    batch = next(learner.batches)
    loss = learner.loss_fn(learner.module, batch)
    loss.backward()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in learner.params]
    norm = torch.sqrt(sum((g.float() ** 2).sum() for g in grads))
    scale = rho / (float(norm) + 1e-12)
    saved = [p.detach().clone() for p in learner.params]
    with torch.no_grad():
        for p, g in zip(learner.params, grads):
            p.add_(g, alpha=scale)
    learner.optimizer.zero_grad(set_to_none=False)
    sharp = learner.loss_fn(learner.module, batch)
    sharp.backward()
    with torch.no_grad():  # restore w exactly (w + e - e is not w in floating point)
        for p, w in zip(learner.params, saved):
            p.copy_(w)
    return {"loss": float(loss.detach()), "sam_loss": float(sharp.detach())}


@dataclass
class SWAState:
    """Running mean of an agent's flat parameters over one round (SWA)."""

    mean: Optional[torch.Tensor] = None
    count: int = 0

    def update(self, flat: torch.Tensor) -> None:
        self.count += 1
        if self.mean is None:
            self.mean = flat.detach().clone().to(torch.float64)
        else:
            self.mean += (flat.to(torch.float64) - self.mean) / self.count

    def take(self, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """The average (or None if nothing was averaged) and reset for the next round."""
        out = None if self.mean is None else self.mean.to(dtype)
        self.mean, self.count = None, 0
        return out

    def state_dict(self) -> dict:
        return {"mean": self.mean, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.count = state["mean"], int(state["count"])


# ---- validator reports ---------------------------------------------------------------

REPORT_COLUMNS = ("metric", "loss", "calibration", "safety", "novelty")


def encode_report(rows: Optional[torch.Tensor], n: int, own_train_loss: float) -> torch.Tensor:
    """This rank's contribution to the score AllGather: [n * C + 2] float64.

    rows: [n, C] validator evaluations of every agent (None on non-validators);
    then this rank's own recent training loss and 1.0 if it validated.
    """
    c = len(REPORT_COLUMNS)
    body = torch.zeros(n * c, dtype=torch.float64) if rows is None else rows.to(torch.float64).reshape(-1)
    tail = torch.tensor([own_train_loss, 0.0 if rows is None else 1.0], dtype=torch.float64)
    return torch.cat([body, tail])


@dataclass
class Published:
    """What every rank knows after the score AllGather (all [n] tensors)."""

    columns: dict = field(default_factory=dict)  # REPORT_COLUMNS -> mean over validators
    train_loss: torch.Tensor = None
    excluded: torch.Tensor = None
    validators: int = 0


def decode_reports(gathered: Sequence[torch.Tensor], n: int, divergence_factor: float) -> Published:
    """Average the validators' rows and flag agents (non-finite or diverging loss)."""
    c = len(REPORT_COLUMNS)
    stack = torch.stack([g.to(torch.float64) for g in gathered])  # [n, n*c + 2]
    is_val = stack[:, -1] > 0.5
    train_loss = stack[:, -2].clone()
    cols = {}
    if is_val.any():
        rows = stack[is_val, : n * c].reshape(-1, n, c).mean(0)  # [n, c]
        cols = {name: rows[:, k].clone() for k, name in enumerate(REPORT_COLUMNS)}
    return Published(cols, train_loss, flag_agents(cols.get("loss"), train_loss, divergence_factor), int(is_val.sum()))


def flag_agents(val_loss: Optional[torch.Tensor], train_loss: torch.Tensor, factor: float) -> torch.Tensor:
    """Agents fusion must exclude: a non-finite loss, or a held-out loss above ``factor``
    times the median of the finite ones (divergence)."""
    bad = ~torch.isfinite(train_loss)
    if val_loss is not None:
        bad |= ~torch.isfinite(val_loss)
        finite = val_loss[torch.isfinite(val_loss)]
        if finite.numel():
            med = finite.median()
            bad |= torch.isfinite(val_loss) & (val_loss > factor * med) & (val_loss > med + 1e-6)
    return bad


# ---- PBT exploit: the winner's optimizer state travels with its weights ---------------

def optimizer_state_flat(learner) -> torch.Tensor:
    """The learner's optimizer state (every tensor of every parameter's state, step
    counts included) as one float64 vector, in parameter order and key order."""
    opt, parts = learner.optimizer, []
    for p in learner.params:
        st = opt.state.get(p, {})
        parts += [st[key].detach().reshape(-1).to(torch.float64) for key in sorted(st) if torch.is_tensor(st[key])]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def load_optimizer_state_flat(learner, flat: torch.Tensor) -> None:
    """Inverse of :func:`optimizer_state_flat` on a learner of the same architecture and
    optimizer: the exploited agent continues with the winner's moments, not its own."""
    opt, offset = learner.optimizer, 0
    with torch.no_grad():
        for p in learner.params:
            st = opt.state.get(p, {})
            for key in sorted(st):
                if torch.is_tensor(st[key]):
                    n = st[key].numel()
                    st[key].copy_(flat[offset:offset + n].reshape(st[key].shape).to(st[key].dtype))
                    offset += n
    if offset != flat.numel():
        raise ValueError(f"optimizer state of {flat.numel()} values does not fit this learner's ({offset})")
