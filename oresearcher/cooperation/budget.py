"""The communication-overhead controller (``communication.budget``): pure decisions.

Without this controller the reference scenario (scenarios/8xA100.yaml, which runs it at the
seed's 8.3% budget) spends 33.8% of its step time blocked on
communication, and 659 of those 672 ms are agents waiting for slower peers: explorers
and validators (one forward-backward per step) wait at every gradient share for the SAM
optimizers (two per step). The network is not the problem; sharing on a step count
across roles whose steps cost different times is. This module decides, once per round,
from what the agents observed in the rounds before:

1. **Balance by time.** Agent i takes ``k_i = max(1, round(w * c_max / c_i))`` local
   steps between gradient shares, c_i being its measured seconds per local step: an
   agent whose steps cost twice as much shares every step while the others share every
   second step, and all arrive at the share together. ``w`` is the widening factor.
2. **Widen the sharing interval** (w = 2, 4, 8, ...) and 3. **tighten the codec**
   (fp32 -> bf16 -> int8 -> top-k 1% with error feedback) when the measured overhead
   is over budget; relax (one or more rungs back) when well under it.

Both knobs sit on one ordered *ladder* of rungs (w, codec), least aggressive first:
the dense codecs at w = 1 (int8 costs little quality and cuts 2-4x of the bytes), then
w doubling up to 8 at int8, then top-k with error feedback (Stich et al. 2018; Karimireddy
et al. 2019, "Error Feedback Fixes SignSGD") from w = 8 up to the round length.

Hysteresis, so it does not oscillate: it tightens only when the measured overhead is
over the budget, and then to the least aggressive rung *predicted* to land under
``TARGET`` x budget; it relaxes only when the measured overhead is under ``RELAX`` x
budget, at least ``COOLDOWN`` rounds after the last tightening, and only to a rung
predicted under ``RELAX_TO`` x budget (below the tightening threshold with margin).
The prediction scales the observed per-share transfer time (the least any agent was
blocked per share: the last to arrive only pays the transfer) by shares per round and
by the codec's wire bytes per element; every agent is blocked for what its own compute
leaves of the round, so unequal compute (the allocation's step counts) counts too.

The round's end is not the controller's: with no share at all an agent still waits there
for the longest compute and pays the parameter gather, the validators' scoring and the
score gather (:func:`end_floor`). When that alone is over the target no rung can fit, and
tightening the sharing would cost quality for a budget it cannot meet: the controller
then keeps the sharing's own part (predicted minus floor) under ``TARGET`` x budget, and
logs the fusion interval that would fit (:func:`fusion_factor`; the interval is
``communication.interval``, fixed for the run, so it is named, not changed).

Vocabulary: *exposed* seconds are a rank's time blocked in communication (the gradient
shares and the round's end: parameter gather and score gather); *overhead* is exposed /
(compute + exposed), summed over ranks (the report's "mean over ranks").
Every input is a number every rank holds (the program all-gathers the timings), so
every rank takes the same decision; :func:`decide` logs nothing and returns the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..comm.wire import int8_bytes_per_element

TARGET = 0.8  # tighten to a rung predicted under TARGET x budget
RELAX = 0.5  # relax only when measured under RELAX x budget ...
RELAX_TO = 0.6  # ... and only to a rung predicted under RELAX_TO x budget
COOLDOWN = 1  # rounds after a tightening before relaxing is allowed
DENSE_MAX_WIDEN = 8  # widen at int8 up to this, then switch to top-k
TOPK = "ef(topk:0.01)"
GRAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Observation:
    """One round as every agent saw it (lists: one entry per agent, seconds)."""

    compute_s: Sequence[float]  # local steps, excluding time blocked at shares
    steps: Sequence[int]  # local steps taken
    share_s: Sequence[float]  # blocked at gradient shares (incl. codec work)
    sync_s: Sequence[float]  # the round's end: parameter gather, scoring, fusion
    shares: int  # gradient shares in the round (the same for every agent)

    def overhead(self) -> float:
        exposed = sum(self.share_s) + sum(self.sync_s)
        total = sum(self.compute_s) + exposed
        return exposed / total if total > 0 else 0.0


@dataclass(frozen=True)
class Decision:
    rung: int
    k: list  # local steps between shares, per agent
    overhead: float  # measured, last round (nan before any)
    predicted: float  # for the chosen rung (nan when unknown)
    reason: str


def ladder(codec: str, dtype: str, max_widen: int) -> list[tuple[int, str]]:
    """Rungs (w, codec spec), least aggressive first. A scenario that names its own codec
    keeps it: only w moves."""
    max_widen = max(1, int(max_widen))
    widths = [w for w in (2 ** i for i in range(0, 63)) if w <= max_widen]
    if codec != "none":
        return [(w, codec) for w in widths]
    dense = ["none"] + (["bf16"] if dtype == "fp32" else []) + ["int8"]
    rungs = [(1, c) for c in dense] + [(w, "int8") for w in widths[1:] if w <= DENSE_MAX_WIDEN]
    top = min(DENSE_MAX_WIDEN, widths[-1])
    return rungs + [(w, TOPK) for w in widths if w >= top]


def bytes_per_element(spec: str, dtype: str) -> float:
    """Approximate wire bytes per gradient element of a codec spec (for predictions only)."""
    g = GRAD_BYTES.get(dtype, 4)
    if spec == "none":
        return float(g)
    if spec in ("bf16", "fp16"):
        return 2.0
    if spec.startswith("int8"):
        return int8_bytes_per_element()  # one fp32 scale per chunk (the codec's layout)
    if "topk" in spec or "randk" in spec:
        ratio = float(spec.split(":")[1].split(")")[0].split("+")[0])
        return ratio * (g + 4)  # values plus int32 indices
    return float(g)


def balance(costs: Sequence[float], widen: int) -> list[int]:
    """Local steps between shares: k_i * c_i ~ widen * max(c), each k_i >= 1."""
    finite = [c for c in costs if c > 0 and math.isfinite(c)]
    cmax = max(finite) if finite else 1.0
    return [max(1, round(widen * cmax / c)) if c > 0 and math.isfinite(c) else widen for c in costs]


def shares_per_round(steps: Sequence[int], k: Sequence[int]) -> int:
    """Shares every agent can take part in: the agent with the fewest k-blocks decides."""
    return min((max(1, s) // max(1, kk) for s, kk in zip(steps, k)), default=0)


def step_costs(obs: Observation) -> list[float]:
    return [c / s if s > 0 else float("nan") for c, s in zip(obs.compute_s, obs.steps)]


def _transfer_per_share(history: Sequence[Observation]) -> float:
    """Seconds one share costs without waiting: the least any agent was blocked per share,
    from the most recent round that shared."""
    for obs in reversed(history):
        if obs.shares > 0:
            return min(obs.share_s) / obs.shares
    return 0.0


def predict(history: Sequence[Observation], rungs, rung: int, now: int, dtype: str) -> float:
    """Overhead predicted for ``rung`` from the last observation taken at rung ``now``: the
    round lasts the longest compute plus the shares (all arrive together) plus the round's
    end, and every agent is blocked for what its own compute leaves of it."""
    obs = history[-1]
    w, spec = rungs[rung]
    k = balance(step_costs(obs), w)
    m = shares_per_round(obs.steps, k)
    scale = bytes_per_element(spec, dtype) / bytes_per_element(rungs[now][1], dtype)
    n = len(obs.compute_s)
    length = max(obs.compute_s) + m * _transfer_per_share(history) * scale + min(obs.sync_s)
    return 1.0 - sum(obs.compute_s) / (n * length) if n and length > 0 else 0.0


def end_floor(obs: Observation) -> float:
    """The overhead of ``obs``'s round had it shared no gradient at all: every agent waits
    at the round's end for the one with the most compute, then pays the round's end itself
    (the least any agent was blocked there: parameter gather, the validators' scoring,
    score gather). No sharing rung goes below it; the fusion interval and the allocation's
    step counts set it."""
    n, r = len(obs.compute_s), max(obs.compute_s, default=0.0) + min(obs.sync_s, default=0.0)
    return 1.0 - sum(obs.compute_s) / (n * r) if n and r > 0 else 0.0


def fusion_factor(obs: Observation, target: float) -> float:
    """How many times longer the fusion interval must be for :func:`end_floor` to reach
    ``target``: compute and the waiting for the longest compute grow with the interval,
    the round's fixed end does not. 1 when it is already under; inf when the agents'
    unequal compute alone is over ``target`` (no interval fits)."""
    n, c = len(obs.compute_s), sum(obs.compute_s)
    if not n or end_floor(obs) <= target:
        return 1.0
    room = c - (1.0 - target) * n * max(obs.compute_s)
    return (1.0 - target) * n * min(obs.sync_s) / room if room > 0 else math.inf


def _floor_note(obs: Observation, budget: float) -> str:
    """What would fit when the round's end alone is over the target."""
    f = fusion_factor(obs, TARGET * budget)
    return (f"a fusion interval {f:.1f}x as long (communication.interval) would fit" if math.isfinite(f) else
            "the agents' unequal compute (roles, allocation) alone is over it: no fusion interval would fit")


@dataclass
class BudgetState:
    """The controller's state: where on the ladder, and what it saw (identical on every rank)."""

    budget: float
    rung: int = 0
    k: list = field(default_factory=list)  # this round's local steps between shares, per agent
    last_tighten: int = -10**9
    history: list = field(default_factory=list)  # Observations, most recent last (kept short)
    decisions: list = field(default_factory=list)  # (round, rung, reason)
    keep: int = 4

    def observe(self, obs: Observation) -> None:
        self.history = (self.history + [obs])[-self.keep:]

    def state_dict(self) -> dict:
        return {"budget": self.budget, "rung": self.rung, "k": list(self.k), "last_tighten": self.last_tighten,
                "history": [vars(o).copy() for o in self.history], "decisions": [list(d) for d in self.decisions]}

    def load_state_dict(self, state: dict) -> None:
        self.budget, self.rung = float(state["budget"]), int(state["rung"])
        self.k, self.last_tighten = [int(x) for x in state["k"]], int(state["last_tighten"])
        self.history = [Observation(**o) for o in state["history"]]
        self.decisions = [tuple(d) for d in state["decisions"]]


def decide(history: Sequence[Observation], rungs, rung: int, budget: float, rnd: int, last_tighten: int,
           dtype: str = "bf16", unit_costs: Optional[Sequence[float]] = None) -> Decision:
    """The next round's rung and per-agent k from the observed history (pure)."""
    if not history:  # nothing measured yet: balance by the cost model (a SAM step = 2 units)
        costs = list(unit_costs or [])
        return Decision(rung, balance(costs, rungs[rung][0]), float("nan"), float("nan"),
                        f"round {rnd}: no measurement yet; balance by unit costs {costs}")
    obs = history[-1]
    o = obs.overhead()
    pred = [predict(history, rungs, r, rung, dtype) for r in range(len(rungs))]
    new, why = rung, "within band"
    floor = end_floor(obs)
    if o > budget and floor > TARGET * budget:  # no rung fits: keep the sharing's own part under target
        fits = [r for r in range(rung, len(rungs)) if pred[r] - floor <= TARGET * budget]
        new = fits[0] if fits else len(rungs) - 1
        why = (f"over budget, but the round's end alone is {floor:.1%} and no sharing rung goes below it "
               f"({_floor_note(obs, budget)}); the sharing's own part "
               + ("predicted under target: hold" if new == rung else "over target: tighten" if fits else
                  "over target at every rung: most aggressive"))
    elif o > budget:
        fits = [r for r in range(rung, len(rungs)) if pred[r] <= TARGET * budget]
        new = fits[0] if fits else len(rungs) - 1
        why = ("over budget; no rung predicted under target: most aggressive" if not fits else
               "over budget; balancing by time alone is predicted to fit" if new == rung else "over budget: tighten")
    elif o < RELAX * budget and rnd - last_tighten > COOLDOWN:
        fits = [r for r in range(0, rung) if pred[r] <= RELAX_TO * budget]
        new, why = (fits[0], "under budget: relax") if fits else (rung, "under budget; no looser rung predicted "
                                                                        f"under {RELAX_TO:g} x budget")
    elif o < RELAX * budget:
        why = "under budget; cooling down after a tightening"
    w, spec = rungs[new]
    k = balance(step_costs(obs), w)
    costs = ", ".join(f"{c * 1e3:.1f}" for c in step_costs(obs))
    reason = (f"round {rnd}: overhead {o:.1%} vs budget {budget:.1%}: {why}; rung {rung}->{new} (w={w}, codec={spec}), "
              f"predicted {pred[new]:.1%}; step costs [{costs}] ms -> k={k}")
    return Decision(new, k, o, pred[new], reason)
