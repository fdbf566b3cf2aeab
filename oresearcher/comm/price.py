"""The room's front door: a collective on a topology in, its plan and its time out.

:func:`plan` hands a collective to the first tier of :data:`TIERS` that prices it: the
NCCL-derived tier (:mod:`.nccl_tier`) where the fabric has an NCCL model and NCCL runs
what was asked, else the analytical alpha-beta tier (:mod:`.alpha_beta`), which prices
everything. Both answer a :class:`~.plan.Plan`; the simulator's engine moves its flows
over the event-driven network, :func:`closed_form_time` prices it alone in closed form.
"""
from __future__ import annotations

from . import alpha_beta, nccl_tier
from .plan import Plan, plan_time

TIERS = (nccl_tier, alpha_beta)  # most faithful first; the last prices everything


def plan(kind: str, ranks: tuple, nbytes: float, topo, requested: str = "auto", root=None) -> Plan:
    """The plan of one collective (``nbytes`` per rank, as :mod:`.schedules` counts them)."""
    if len(ranks) <= 1:
        return Plan("ring", 0.0, (), ())
    if kind == "ReduceScatter" and topo.protocol(ranks).reduce_scatter == "all_reduce":
        kind = "AllReduce"  # gloo: an all-reduce of the whole input (FabricProfile.reduce_scatter)
    tier = next(t for t in TIERS if t.applies(kind, requested, topo))
    return tier.plan(kind, ranks, nbytes, topo, requested, root)


def closed_form_time(kind: str, algorithm: str, ranks: tuple, nbytes: float, topo, root=None) -> float:
    """Time of one collective alone on an idle network (the closed-form tier)."""
    return plan_time(plan(kind, ranks, nbytes, topo, algorithm, root), topo)
