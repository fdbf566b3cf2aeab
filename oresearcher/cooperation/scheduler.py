"""Device time for N agents hosted on M devices (N >= M): a pure module, plain values in,
decisions out; the hosted cooperative program (oresearcher.programs.cooperative_hosted)
carries them out and the simulator prices them.

Placement is fixed: agent ``a`` lives on device ``a // k`` (``k = N / M`` agents per
device); its state (parameters, gradients, optimizer state) sits in host memory while
another agent of the device runs, and moves in before its slice and out after it.

Each round hands out ``total = M * units_per_device`` units of device time (one unit:
one forward+backward pass of an agent's model, as in oresearcher.cooperation.allocation):

- targets: ``shares * total`` with ``shares`` from :func:`allocation.shares` (softmax of
  the contributions, raised to a floor); targets sum to ``total`` exactly.
- whole steps: an agent takes ``floor((credit + target) / cost)`` steps of ``cost``
  units; what it did not spend (or overspent) is carried as credit to the next round
  (deficit round robin), so over a run every agent's device time tracks the sum of its
  targets within one step, whatever the rounding of each round.
- the device's round time is the sum of its agents' slices plus a switch per slice
  (state in and out at the host link's bandwidth); a device whose agents hold less
  than 1/M of the shares idles at the round's gather (reported, not hidden).

Metered (once the device seconds of a round are known, :meth:`Scheduler.settle`): what
a step really costs is not what a unit says (on shared cores the same step costs more
CPU time while every rank computes than alone), so once measurements exist the plan is
in seconds, and the credit carried is in seconds of what was really used:

- each agent's estimated seconds per unit: its last slice's seconds / units (an agent
  that ran no step: the median of the others);
- the round's device seconds: ``M * units_per_device * median(estimates)`` (the same on
  every rank: every rank holds every agent's gathered figures); targets: shares of it;
- steps: ``floor((target + credit) / (cost * estimate))`` is the plan's estimate; the
  slice itself is metered (:func:`keep_stepping`): it takes steps while its seconds so
  far plus its mean step so far fit ``budget_s = target + credit``, so who runs beside it
  this round (the estimate came from the last) does not move its time; after the round
  ``credit = target + credit - measured seconds`` (deficit round robin on time used),
  clamped to ``+-(target + one step's seconds)`` of that round (:func:`clamp_credit`).
  A slice then misses its budget by about a step, and the credit stays that small.

The first measured round was planned in units: its seconds become the first estimates,
its targets are reported in seconds at the median rate, and only its rounding remainder
is carried (its deviation, warm-up included, is not the schedule's to repay; it is
counted in ``dropped``). Over a run, for every agent, ``given - used == credit +
dropped`` exactly, so while the clamp does not bind the device seconds used trail the
seconds handed out by at most one round's target plus one step (tested); with metered
slices, by about one step (tested with step costs that change every step).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from .allocation import shares as softmax_shares


def placement(n_agents: int, n_devices: int) -> list[int]:
    """Device of each agent: contiguous blocks of ``n_agents // n_devices``."""
    if n_devices < 1 or n_agents < n_devices or n_agents % n_devices:
        raise ValueError(f"{n_agents} agents do not divide evenly over {n_devices} devices (need N >= M, M | N)")
    k = n_agents // n_devices
    return [a // k for a in range(n_agents)]


def hosted(device: int, n_agents: int, n_devices: int) -> list[int]:
    """Agents that ``device`` hosts, in the order it runs them."""
    return [a for a, d in enumerate(placement(n_agents, n_devices)) if d == device]


def targets(fractions: Sequence[float], total: float) -> list[float]:
    """Device time per agent this round: ``fractions`` (summing to 1) times ``total``."""
    s = sum(float(f) for f in fractions)
    if s <= 0:
        raise ValueError("fractions must have a positive sum")
    return [float(f) / s * total for f in fractions]


def whole_steps(target: Sequence[float], costs: Sequence[float], credit: Sequence[float],
                rel: float = 0.0) -> tuple[list[int], list[float]]:
    """(steps, new credit): ``steps[i] * costs[i] + new_credit[i] == target[i] + credit[i]``,
    with ``0 <= new_credit[i] < costs[i]`` (an agent never runs ahead of its time).

    ``rel``: a step that fits up to that fraction of its cost counts as fitting (the
    credit then dips that little below 0): metered plans are in float seconds, where a
    target of exactly 20 steps can come out as 19.999999999999996 of them."""
    steps, left = [], []
    for t, c, k in zip(target, costs, credit):
        if c <= 0:
            raise ValueError(f"a step costs a positive amount of device time, got {c}")
        avail = t + k
        s = max(0, math.floor(avail / c + rel)) if rel else max(0, int(avail // c))
        steps.append(s)
        left.append(avail - s * c)
    return steps, left


def unit_seconds(seconds: Sequence[float], units: Sequence[float], previous=None):
    """Estimated device seconds per unit, per agent: ``seconds / units`` of its last slice
    where it ran (``units > 0``) and the time is finite and positive; the others get the
    median of those. No usable figure at all: ``previous`` (None before any)."""
    own = [float(s) / u if u > 0 and math.isfinite(float(s)) and float(s) > 0 else None
           for s, u in zip(seconds, units)]
    ok = [e for e in own if e is not None]
    if not ok:
        return None if previous is None else list(previous)
    med = statistics.median(ok)
    return [med if e is None else e for e in own]


def clamp_credit(credit: float, target: float, step_s: float) -> float:
    """Credit kept after a metered round: within ``+-(target + step_s)`` of that round.

    ``+ step_s``: the ordinary rounding remainder (up to one step) is never cut, so without
    bursts the deficit round robin is exact. ``target``: a debt is repaid within one round
    (an agent that overran by a burst of a shared host, or a warm-up, sits out at most one
    round, not many), and saved-up credit buys at most one extra round's time (no flood)."""
    bound = abs(target) + abs(step_s)
    return min(bound, max(-bound, credit))


def keep_stepping(spent: float, ran: int, budget: float, estimate: float, cap: int) -> bool:
    """Whether a metered slice takes one more step: ``spent`` device seconds in its ``ran``
    steps so far, ``budget`` its seconds this round (target + credit). The next step is
    expected to cost the slice's mean step so far (the contention it runs under now),
    before its first step the plan's ``estimate``; it runs only if that still fits the
    budget (never ahead: the remainder, under a step, is the next round's credit).
    ``cap`` bounds the steps whatever a clock says (one that does not advance)."""
    if ran >= cap:
        return False
    nxt = spent / ran if ran else estimate
    return spent + nxt <= budget * (1 + 1e-9)


def slice_cap(planned: int) -> int:
    """Most steps a metered slice may take: four times the plan's plus four. The plan's
    ``planned = floor(budget / estimate)`` steps, so the cap lets a slice spend its whole
    budget on steps as cheap as a quarter of the estimate (contention falling 4x within a
    round), and still stops a clock that does not advance."""
    return 4 * (planned + 1)


def switch_seconds(state_bytes: float, host_link_Bps: float) -> float:
    """One switch of one agent: its state out to host memory and back in (two moves)."""
    if host_link_Bps <= 0:
        raise ValueError("host link bandwidth must be positive")
    return 2.0 * state_bytes / host_link_Bps


@dataclass
class RoundPlan:
    """What one round runs: steps per agent, the time handed out, and each device's load."""

    steps: list
    target: list  # device time per agent this round (sum: the round's total): units, seconds if metered
    shares: list
    device_units: list  # units each device computes this round
    switches: list  # agent slices per device (each one switch in, one out)
    metered: bool = False  # planned in seconds from measurements
    step_s: list | None = None  # metered: estimated seconds of one step per agent
    budget_s: list | None = None  # metered: device seconds each slice may spend (target + credit)


class Scheduler:
    """Shares -> device time -> whole steps, with credit carried between rounds.

    ``last`` holds the previous round's allocation rewards (computed by the caller under
    one fixed weighting); :meth:`fresh` forgets an agent's (PBT exploit: its new
    parameters are someone else's, so its next improvement is not its own). ``used`` and
    ``given``: device time each agent has used and has been handed over the whole run, in
    units until the first :meth:`settle`, in seconds from then on (``unit_s`` set).
    ``dropped``: seconds the credit clamp forgot (+: credit forfeited, -: debt forgiven).
    ``pending``: the last plan, until :meth:`settle` accounts for it.
    """

    KEYS = ("n_agents", "n_devices", "temperature", "floor", "enabled", "credit", "last", "used", "given",
            "unit_s", "dropped", "pending")

    def __init__(self, n_agents: int, n_devices: int, temperature: float = 0.1, floor: float = 0.5,
                 enabled: bool = True):
        placement(n_agents, n_devices)  # validates N and M
        self.n_agents, self.n_devices = n_agents, n_devices
        self.temperature, self.floor, self.enabled = temperature, floor, enabled
        self.credit, self.used, self.given, self.dropped = ([0.0] * n_agents for _ in range(4))
        self.last = [float("nan")] * n_agents
        self.unit_s = None  # estimated seconds per unit per agent: None until a round is measured
        self.pending = None

    @property
    def metered(self) -> bool:
        return self.unit_s is not None

    def contributions(self, rewards: Sequence[float]) -> list[float]:
        """Reward improvements since the last round (0 where either is unknown)."""
        out = [float(r) - p if (p == p and r == r) else 0.0 for r, p in zip(rewards, self.last)]
        self.last = [float(r) for r in rewards]
        return out

    def fresh(self, agent: int) -> None:
        self.last[agent] = float("nan")

    def plan(self, rewards: Sequence[float], units_per_device: float, costs: Sequence[int]) -> RoundPlan:
        """The next round: in units before any measurement (credit, used and given move
        at once, as the plan is exact in units), in seconds after (they move at
        :meth:`settle`, once the round's device seconds are known)."""
        if self.pending is not None and self.pending["metered"]:
            raise RuntimeError("settle() the last metered round before planning the next")
        n = self.n_agents
        contrib = self.contributions(rewards)
        if self.enabled:
            s = [float(x) for x in softmax_shares(contrib, self.temperature, self.floor)]
        else:
            s = [1.0 / n] * n
        step_s = None
        if self.metered:
            tgt = targets(s, self.n_devices * units_per_device * statistics.median(self.unit_s))
            step_s = [c * e for c, e in zip(costs, self.unit_s)]
            steps, _ = whole_steps(tgt, step_s, self.credit, rel=1e-9)  # the credit moves when measured
        else:
            tgt = targets(s, self.n_devices * units_per_device)
            steps, self.credit = whole_steps(tgt, costs, self.credit)
        place = placement(n, self.n_devices)
        dev = [0.0] * self.n_devices
        sw = [0] * self.n_devices
        for a in range(n):
            dev[place[a]] += steps[a] * costs[a]
            sw[place[a]] += 1
            if not self.metered:
                self.used[a] += steps[a] * costs[a]
                self.given[a] += tgt[a]
        self.pending = {"target": list(tgt), "steps": list(steps), "costs": [float(c) for c in costs],
                        "metered": self.metered, "step_s": step_s}
        budget = [t + c for t, c in zip(tgt, self.credit)] if self.metered else None
        return RoundPlan(steps, tgt, s, dev, sw, self.metered, step_s, budget)

    def settle(self, seconds: Sequence[float], units: Sequence[float]):
        """Account for the planned round: ``seconds`` and ``units`` of device time each
        agent used (every agent's, the same figures on every rank). Returns the round's
        targets in seconds (None while no figure is usable: still in units).

        A measurement that is not a finite, non-negative number counts as what the plan
        estimated (units x the agent's estimate)."""
        p, n = self.pending, self.n_agents
        if p is None:
            raise RuntimeError("settle() needs a planned round")
        if len(seconds) != n or len(units) != n:
            raise ValueError(f"settle() needs {n} agents' seconds and units, got {len(seconds)} and {len(units)}")
        est = unit_seconds(seconds, units, self.unit_s)
        if est is None:
            self.pending = None
            return None
        base = p["step_s"] if p["metered"] else [c * e for c, e in zip(p["costs"], est)]
        used = [float(s) if math.isfinite(float(s)) and float(s) >= 0 else u * b / c
                for s, u, b, c in zip(seconds, units, base, p["costs"])]
        if p["metered"]:
            tgt = p["target"]
            raw = [t + k - m for t, k, m in zip(tgt, self.credit, used)]
            step_s = p["step_s"]
        else:  # the first measured round: the run so far moves to seconds at the median rate
            med = statistics.median(est)
            tgt = [t * med for t in p["target"]]
            self.given = [g * med for g in self.given]
            self.used = [(u - k * c) * med for u, k, c in zip(self.used, p["steps"], p["costs"])]  # less this round
            raw = [k * med for k in self.credit]  # its rounding remainder, not its deviation
            self.dropped = [g - u - m - k for g, u, m, k in zip(self.given, self.used, used, raw)]
            step_s = base
        self.credit = [clamp_credit(r, t, b) for r, t, b in zip(raw, tgt, step_s)]
        for a in range(n):
            self.dropped[a] += raw[a] - self.credit[a]
            self.used[a] += used[a]
            if p["metered"]:
                self.given[a] += tgt[a]
        self.unit_s, self.pending = est, None
        return list(tgt)

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, list(v) if isinstance(v, list) else v)
