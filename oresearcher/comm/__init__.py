"""The communication room: what moving bytes between ranks costs, in one place.

Pure math on numbers and rank ids (no SimPy, no torch): the simulator's engine, the real
backend's wire-byte counts, calibration's fits, the codecs' exchanges and the overhead
controller all ask here. Shaped as ASTRA-sim's analytical network backend: one topology
(links and routes), and the cost of a collective on it from one of two tiers behind one
interface (:class:`~.plan.Tier`)::

    plan(kind, ranks, nbytes, topo, algorithm, root) -> Plan      (price.py)
        nccl_tier   NCCL's algorithm x protocol model where the fabric has one (nccl.py: the tuner's math)
        alpha_beta  the schedules of schedules.py, steps x hop + bytes at max-min fair rates
    plan_time(plan, topo) -> seconds alone on an idle network   (plan.py: the formula, once)

Modules: :mod:`.units` (the one conversion to seconds, bytes, bytes/s), :mod:`.schedules`
(ring/tree/... phases, the ring's peer term, the algorithm names), :mod:`.wire` (wire
bytes, the int8 codec's chunk), :mod:`.topology` and :mod:`.tiers` (links, routes, switch
tiers), :mod:`.maxmin` (fair shares of links), :mod:`.plan`, :mod:`.alpha_beta`,
:mod:`.nccl`, :mod:`.nccl_tier`, :mod:`.price`.
"""
from __future__ import annotations

from .alpha_beta import choose_algorithm
from .plan import Plan, Tier, plan_time
from .price import TIERS, closed_form_time, plan
from .schedules import ALGORITHM_CHOICES, ALGORITHMS, DIRECT_MAX_RANKS, SUPPORTED, Phase, phases
from .topology import Topology, build_topology
from .wire import INT8_CHUNK, wire_bytes, wire_bytes_by_rank, wire_bytes_per_rank

__all__ = ["ALGORITHMS", "ALGORITHM_CHOICES", "DIRECT_MAX_RANKS", "INT8_CHUNK", "SUPPORTED", "TIERS", "Phase",
           "Plan", "Tier", "Topology", "build_topology", "choose_algorithm", "closed_form_time", "phases", "plan",
           "plan_time", "wire_bytes", "wire_bytes_by_rank", "wire_bytes_per_rank"]
