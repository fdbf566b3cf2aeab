"""The analytical tier: alpha-beta pricing of the schedules in :mod:`.schedules`.

Each phase of a schedule costs ``steps x hop latency`` (alpha) and then the time the
network needs to move its flows alone at max-min fair rates (beta), after the fabric's
per-call and per-collective fixed cost (:mod:`.plan`). It prices every collective on a
fabric without an NCCL model (gloo, PCIe, a fitted CPU fabric), and any algorithm NCCL
does not run (direct, halving-doubling, hierarchical) where there is one. ``auto``
picks the schedule that is fastest alone on an idle network.
"""
from __future__ import annotations

from .plan import Plan, fixed_cost, phase_latency, plan_time
from .schedules import DIRECT_MAX_RANKS, SUPPORTED, phases


def applies(kind: str, requested: str, topo) -> bool:
    """Every collective: the tier under the NCCL-derived one."""
    return True


def plan(kind: str, ranks: tuple, nbytes: float, topo, requested: str = "auto", root=None) -> Plan:
    """The plan of the schedule ``requested`` (or the fastest, for ``auto``)."""
    return _plan(kind, choose_algorithm(kind, ranks, nbytes, topo, requested), ranks, nbytes, topo, root)


def _plan(kind, algorithm, ranks, nbytes, topo, root=None) -> Plan:
    ph = phases(kind, algorithm, ranks, nbytes, topo.node_of, root)
    return Plan(algorithm, fixed_cost(kind, ranks, topo), tuple(ph), tuple((phase_latency(p, topo), p) for p in ph))


def choose_algorithm(kind: str, ranks: tuple, nbytes: float, topo, requested: str = "auto") -> str:
    """``requested`` if it applies, else the fastest supported algorithm on an idle network."""
    if requested != "auto":
        return requested if requested in SUPPORTED[kind] else SUPPORTED[kind][0]
    memo = topo._auto
    key = (kind, ranks, float(nbytes))
    best = memo.get(key)
    if best is None:
        candidates = [a for a in SUPPORTED[kind]
                      if not (a == "direct" and len(ranks) > DIRECT_MAX_RANKS and kind != "AllToAll")]
        best = memo[key] = min(candidates, key=lambda a: (
            plan_time(_plan(kind, a, ranks, nbytes, topo), topo), SUPPORTED[kind].index(a)))
    return best
