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
"""
from __future__ import annotations

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


def whole_steps(target: Sequence[float], costs: Sequence[int], credit: Sequence[float]) -> tuple[list[int], list[float]]:
    """(steps, new credit): ``steps[i] * costs[i] + new_credit[i] == target[i] + credit[i]``,
    with ``0 <= new_credit[i] < costs[i]`` (an agent never runs ahead of its time)."""
    steps, left = [], []
    for t, c, k in zip(target, costs, credit):
        if c <= 0:
            raise ValueError(f"a step costs a positive number of units, got {c}")
        avail = t + k
        s = max(0, int(avail // c))
        steps.append(s)
        left.append(avail - s * c)
    return steps, left


def switch_seconds(state_bytes: float, host_link_Bps: float) -> float:
    """One switch of one agent: its state out to host memory and back in (two moves)."""
    if host_link_Bps <= 0:
        raise ValueError("host link bandwidth must be positive")
    return 2.0 * state_bytes / host_link_Bps


@dataclass
class RoundPlan:
    """What one round runs: steps per agent, the time handed out, and each device's load."""

    steps: list
    target: list  # units of device time per agent this round (sum: the round's total)
    shares: list
    device_units: list  # units each device computes this round
    switches: list  # agent slices per device (each one switch in, one out)


class Scheduler:
    """Shares -> device time -> whole steps, with credit carried between rounds.

    ``last`` holds the previous round's allocation rewards (computed by the caller under
    one fixed weighting); :meth:`fresh` forgets an agent's (PBT exploit: its new
    parameters are someone else's, so its next improvement is not its own). ``used`` and
    ``given``: units each agent has computed and has been handed over the whole run.
    """

    KEYS = ("n_agents", "n_devices", "temperature", "floor", "enabled", "credit", "last", "used", "given")

    def __init__(self, n_agents: int, n_devices: int, temperature: float = 0.1, floor: float = 0.5,
                 enabled: bool = True):
        placement(n_agents, n_devices)  # validates N and M
        self.n_agents, self.n_devices = n_agents, n_devices
        self.temperature, self.floor, self.enabled = temperature, floor, enabled
        self.credit, self.used, self.given = ([0.0] * n_agents for _ in range(3))
        self.last = [float("nan")] * n_agents

    def contributions(self, rewards: Sequence[float]) -> list[float]:
        """Reward improvements since the last round (0 where either is unknown)."""
        out = [float(r) - p if (p == p and r == r) else 0.0 for r, p in zip(rewards, self.last)]
        self.last = [float(r) for r in rewards]
        return out

    def fresh(self, agent: int) -> None:
        self.last[agent] = float("nan")

    def plan(self, rewards: Sequence[float], units_per_device: float, costs: Sequence[int]) -> RoundPlan:
        n = self.n_agents
        contrib = self.contributions(rewards)
        if self.enabled:
            s = [float(x) for x in softmax_shares(contrib, self.temperature, self.floor)]
        else:
            s = [1.0 / n] * n
        tgt = targets(s, self.n_devices * units_per_device)
        steps, self.credit = whole_steps(tgt, costs, self.credit)
        place = placement(n, self.n_devices)
        dev = [0.0] * self.n_devices
        sw = [0] * self.n_devices
        for a in range(n):
            dev[place[a]] += steps[a] * costs[a]
            sw[place[a]] += 1
            self.used[a] += steps[a] * costs[a]
            self.given[a] += tgt[a]
        return RoundPlan(steps, tgt, s, dev, sw)

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, list(v) if isinstance(v, list) else v)
