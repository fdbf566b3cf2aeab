"""A collective's plan, what both tiers answer, and its time alone on an idle network.

A :class:`Plan` is how one collective runs: ``fixed`` seconds first, then each phase (its
latency, then its flows), and never less than ``floor`` seconds in all. The analytical
tier (:mod:`.alpha_beta`) and the NCCL-derived tier (:mod:`.nccl_tier`) each turn a
collective into one; the simulator's event-driven engine moves its flows over the
max-min fair network, and :func:`plan_time` prices it alone in closed form:

    fixed + sum over phases (latency + time to move the phase's flows alone)

the alpha-beta formula, here once: ``latency`` is the alpha term (steps x hop latency,
or NCCL's latency), the flows' time the beta term (bytes / max-min fair rate).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .maxmin import maxmin_rates
from .schedules import Phase


@dataclass(frozen=True)
class Plan:
    """How one collective runs: what the engine and the closed form both follow.

    ``fixed`` seconds first, then each phase (its latency, then its flows; ``timing``
    holds the flows with the bytes that set their duration, ``phases`` the bytes that
    cross the wire), and the call never takes less than ``floor`` seconds in all."""
    label: str
    fixed: float
    phases: tuple  # of Phase, payload bytes
    timing: tuple  # of (latency seconds, Phase with timing bytes)
    floor: float = 0.0


class Tier(Protocol):
    """One fidelity tier of collective pricing (a module: :mod:`.alpha_beta`, :mod:`.nccl_tier`)."""

    def applies(self, kind: str, requested: str, topo) -> bool:
        """Whether this tier prices ``kind`` asked as ``requested`` on ``topo``."""

    def plan(self, kind: str, ranks: tuple, nbytes: float, topo, requested: str = "auto", root=None) -> Plan:
        """The plan of one collective of ``nbytes`` per rank over ``ranks`` (two or more)."""


def phase_latency(phase: Phase, topo) -> float:
    """The alpha term of a phase: its steps x the slowest hop it takes."""
    return phase.steps * max(topo.hop_latency(s, d) for s, d, _ in phase.flows)


def phase_transfer_time(phase: Phase, topo) -> float:
    """The beta term: time to move the phase's flows alone on the network (max-min fair rates)."""
    live = [(topo.route(s, d), b) for s, d, b in phase.flows if b > 0 and s != d]
    if not live:
        return 0.0
    rates = maxmin_rates([r for r, _ in live], topo.capacity)
    return max(b / r for (_, b), r in zip(live, rates))


def fixed_cost(kind: str, ranks, topo) -> float:
    """Per-call host overhead plus per-collective base latency of the fabric used."""
    proto = topo.protocol(ranks)
    if kind == "SendRecv":
        return proto.call_overhead
    return proto.call_overhead + proto.base_latency


def plan_time(pl: Plan, topo) -> float:
    """Time of a plan alone on an idle network (the closed form of what the engine runs)."""
    t = pl.fixed + sum(lat + phase_transfer_time(p, topo) for lat, p in pl.timing)
    return max(t, pl.floor)
