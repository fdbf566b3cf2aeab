"""Collective algorithms as sequences of phases of concurrent flows (alpha-beta model).

A collective over ``ranks`` with per-rank payload ``nbytes`` becomes a list of
:class:`Phase`. A phase is a set of flows that run at the same time plus the number of
sequential algorithm steps it takes; it costs ``steps x hop latency`` and then the time
the network needs to move its flows. A ring all-reduce's 2(n-1) steps each move S/n
bytes per rank at the same time, so they are modelled as one phase of 2(n-1)/n * S
bytes per rank with 2(n-1) hops of latency: the same bandwidth and latency terms as
Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
MPICH" (IJHPCA 2005), without simulating each step.

Payload convention (``nbytes``, per rank, what the op's input holds):
AllReduce/ReduceScatter/Broadcast: the tensor; AllGather: this rank's contribution;
AllToAll: the sum of the tensors this rank sends. An algorithm that does not apply to an
op (tree reduce-scatter, halving-doubling on a non-power-of-two group) falls back to ring.
"""
from __future__ import annotations

from dataclasses import dataclass
from .network import maxmin_rates

# 'auto' considers all-pairs ("direct") algorithms only up to this group size: one
# NVSwitch domain. Beyond it they mean n^2 flows, which no library uses at scale.
DIRECT_MAX_RANKS = 16
ALGORITHMS = ("ring", "tree", "direct", "halving_doubling", "hierarchical")
_SUPPORTED = {
    "AllReduce": ALGORITHMS,
    "ReduceScatter": ("ring", "direct", "halving_doubling", "hierarchical"),
    "AllGather": ("ring", "direct", "halving_doubling", "hierarchical"),
    "AllToAll": ("direct", "ring"),
    "Broadcast": ("ring", "tree", "direct", "hierarchical"),
    "Barrier": ("ring", "tree"),
    "SendRecv": ("direct",),
}


@dataclass(frozen=True)
class Phase:
    flows: tuple  # ((src, dst, nbytes), ...)
    steps: int  # sequential algorithm steps, each paying one hop latency


def _ring_flows(ranks, nbytes):
    n = len(ranks)
    return tuple((ranks[i], ranks[(i + 1) % n], nbytes) for i in range(n))


def _pairs(ranks, nbytes):
    return tuple((a, b, nbytes) for a in ranks for b in ranks if a != b)


def _is_pow2(n):
    return n > 0 and n & (n - 1) == 0


def _by_node(ranks, node_of):
    """Ranks grouped per node, or None when nodes hold unequal numbers of them."""
    nodes = {}
    for r in ranks:
        nodes.setdefault(node_of[r], []).append(r)
    groups = list(nodes.values())
    if len({len(g) for g in groups}) != 1:
        return None
    return groups


def _tree_edges(order):
    """(parent, child) edges of a binary heap laid over ``order`` (order[0] is root)."""
    return [(order[(p - 1) // 2], order[p]) for p in range(1, len(order))]


def _depth(n):
    return max(1, (n).bit_length() - 1) if n > 1 else 0


def _halving(ranks, nbytes, reverse=False):
    """Recursive halving (reduce-scatter) or, reversed, recursive doubling (gather)."""
    n = len(ranks)
    k_max = n.bit_length() - 1
    phases = []
    for k in range(k_max):
        d = n >> (k + 1)
        size = nbytes / 2 ** (k + 1)
        phases.append(Phase(tuple((ranks[i], ranks[i ^ d], size) for i in range(n)), 1))
    return phases[::-1] if reverse else phases


def _hier(kind, ranks, nbytes, node_of):
    groups = _by_node(ranks, node_of)
    if groups is None or len(groups) == 1:
        return None
    g, m = len(groups[0]), len(groups)
    rails = [[grp[i] for grp in groups] for i in range(g)]

    def intra(size, steps):
        return Phase(tuple(f for grp in groups for f in _ring_flows(grp, size)), steps) if g > 1 else None

    def inter(size, steps):
        return Phase(tuple(f for rail in rails for f in _ring_flows(rail, size)), steps)

    if kind == "AllReduce":
        out = [intra((g - 1) / g * nbytes, g - 1), inter(2 * (m - 1) / m * nbytes / g, 2 * (m - 1)),
               intra((g - 1) / g * nbytes, g - 1)]
    elif kind == "ReduceScatter":
        out = [intra((g - 1) / g * nbytes, g - 1), inter((m - 1) / m * nbytes / g, m - 1)]
    elif kind == "AllGather":
        out = [inter((m - 1) * nbytes, m - 1), intra((g - 1) * m * nbytes, g - 1)]
    elif kind == "Broadcast":
        return None  # handled by the caller with the root
    else:
        return None
    return [p for p in out if p is not None]


def phases(kind: str, algorithm: str, ranks: tuple, nbytes: float, node_of, root: int | None = None) -> list[Phase]:
    """The phases of one collective (see module docstring for conventions)."""
    n = len(ranks)
    if n <= 1:
        return []
    if algorithm not in _SUPPORTED[kind] or (algorithm == "halving_doubling" and not _is_pow2(n)):
        algorithm = _SUPPORTED[kind][0]
    S = float(nbytes)
    if kind == "Barrier":
        kind, S = "AllReduce", 0.0
    if kind == "SendRecv":
        return [Phase(((ranks[0], ranks[1], S),), 1)]
    if algorithm == "hierarchical":
        if kind == "Broadcast":
            return _hier_broadcast(ranks, S, node_of, root)
        out = _hier(kind, ranks, S, node_of)
        if out is not None:
            return out
        algorithm = "ring"
    if kind == "AllReduce":
        if algorithm == "ring":
            return [Phase(_ring_flows(ranks, 2 * (n - 1) / n * S), 2 * (n - 1))]
        if algorithm == "direct":
            return [Phase(_pairs(ranks, S / n), 1), Phase(_pairs(ranks, S / n), 1)]
        if algorithm == "halving_doubling":
            return _halving(ranks, S) + _halving(ranks, S, reverse=True)
        # double binary tree (NCCL 2.4): two heap trees, the second mirrored so most
        # interior nodes of one are leaves of the other; each carries half the data
        # up (reduce) and down (broadcast), pipelined.
        flows = []
        for order in (list(ranks), list(ranks)[::-1]):
            for p, c in _tree_edges(order):
                flows += [(c, p, S / 2), (p, c, S / 2)]
        return [Phase(tuple(flows), 2 * _depth(n))]
    if kind == "ReduceScatter":
        if algorithm == "ring":
            return [Phase(_ring_flows(ranks, (n - 1) / n * S), n - 1)]
        if algorithm == "direct":
            return [Phase(_pairs(ranks, S / n), 1)]
        return _halving(ranks, S)
    if kind == "AllGather":
        if algorithm == "ring":
            return [Phase(_ring_flows(ranks, (n - 1) * S), n - 1)]
        if algorithm == "direct":
            return [Phase(_pairs(ranks, S), 1)]
        return [Phase(tuple((ranks[i], ranks[i ^ (1 << k)], S * 2 ** k) for i in range(n)), 1)
                for k in range(n.bit_length() - 1)]
    if kind == "AllToAll":
        if algorithm == "direct":
            return [Phase(_pairs(ranks, S / n), 1)]
        return [Phase(tuple((ranks[i], ranks[(i + k) % n], S / n) for i in range(n)), 1) for k in range(1, n)]
    if kind == "Broadcast":
        root = ranks[0] if root is None else root
        i = ranks.index(root)
        order = list(ranks[i:]) + list(ranks[:i])
        if algorithm == "ring":  # pipelined chain from the root
            return [Phase(tuple((order[k], order[k + 1], S) for k in range(n - 1)), n - 1)]
        if algorithm == "direct":
            return [Phase(tuple((root, r, S) for r in order[1:]), 1)]
        return [Phase(tuple((p, c, S) for p, c in _tree_edges(order)), _depth(n))]
    raise ValueError(f"unknown collective {kind}")


def _hier_broadcast(ranks, S, node_of, root):
    root = ranks[0] if root is None else root
    nodes = {}
    for r in ranks:
        nodes.setdefault(node_of[r], []).append(r)
    leaders = {nd: (root if node_of[root] == nd else rs[0]) for nd, rs in nodes.items()}
    first = tuple((root, ld, S) for nd, ld in leaders.items() if ld != root)
    second = tuple((leaders[nd], r, S) for nd, rs in nodes.items() for r in rs if r != leaders[nd])
    return [p for p in (Phase(first, 1) if first else None, Phase(second, 1) if second else None) if p]


def wire_bytes_by_rank(phase_list) -> dict:
    """Bytes each rank sends over all phases."""
    out = {}
    for p in phase_list:
        for s, _, b in p.flows:
            out[s] = out.get(s, 0.0) + b
    return out


def wire_bytes_per_rank(kind: str, algorithm: str, nbytes: float, n: int) -> float:
    """Mean bytes one rank sends for a collective on ``n`` ranks of one node."""
    ranks = tuple(range(n))
    ph = phases(kind, algorithm if algorithm != "auto" else "ring", ranks, nbytes, [0] * n)
    return sum(wire_bytes_by_rank(ph).values()) / n


def phase_latency(phase: Phase, topo) -> float:
    return phase.steps * max(topo.hop_latency(s, d) for s, d, _ in phase.flows)


def phase_transfer_time(phase: Phase, topo) -> float:
    """Time to move the phase's flows alone on the network (max-min fair rates)."""
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


def _nccl_applies(kind, requested, topo) -> bool:
    if topo.intra.nccl is None:
        return False
    if kind in ("AllToAll", "SendRecv"):  # NCCL's point-to-point path, whatever was asked
        return True
    return requested in ("auto", "ring", "tree") and kind in (
        "AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Barrier")


def plan(kind: str, ranks: tuple, nbytes: float, topo, requested: str = "auto", root=None) -> Plan:
    """The plan of one collective: NCCL's protocol model where the fabric has one
    (:mod:`.nccl`), else the alpha-beta algorithms of this module."""
    if len(ranks) <= 1:
        return Plan("ring", 0.0, (), ())
    if _nccl_applies(kind, requested, topo):
        return _nccl_plan("AllReduce" if kind == "Barrier" else kind, ranks, float(nbytes), topo, requested, root)
    algo = choose_algorithm(kind, ranks, nbytes, topo, requested)
    ph = phases(kind, algo, ranks, nbytes, topo.node_of, root)
    return Plan(algo, fixed_cost(kind, ranks, topo), tuple(ph), tuple((phase_latency(p, topo), p) for p in ph))


def _nccl_p2p_plan(kind, ranks, S, topo) -> Plan:
    """NCCL's send/recv (all-to-all is one send and one receive per peer, grouped)."""
    from . import nccl as N

    p = topo.intra.nccl
    ph = phases(kind, "direct", ranks, S, topo.node_of)
    per_peer = S if kind == "SendRecv" else S / len(ranks)
    cross = any(not topo.same_node(s, d) for q in ph for s, d, _ in q.flows)
    net = topo.inter.nccl_net if (cross and topo.inter is not None) else None
    if cross and net is None:
        raise ValueError(f"inter-node fabric {topo.inter.name if topo.inter else None!r} has no nccl_net section")
    c = N.p2p(per_peer, p, net, topo.intra.bandwidth if not cross else topo.inter.bandwidth)
    timing = tuple((0.0, Phase(tuple((s, d, b / c.bw_factor) for s, d, b in q.flows), q.steps)) for q in ph)
    groups = _by_node(ranks, topo.node_of)
    local = max(len(g) for g in groups) if groups else len(ranks)
    floor = N.host_floor(topo.launch, local if kind == "AllToAll" else 1, topo.intra.call_overhead, p.launch_us * 1e-6)
    return Plan(c.label, c.latency, tuple(ph), timing, floor)


def _nccl_plan(kind, ranks, S, topo, requested, root) -> Plan:
    from . import nccl as N

    if kind in ("AllToAll", "SendRecv"):
        return _nccl_p2p_plan(kind, ranks, S, topo)
    p = topo.intra.nccl
    groups = _by_node(ranks, topo.node_of)
    nodes = len(groups) if groups else len({topo.node_of[r] for r in ranks})
    net = topo.inter.nccl_net if (nodes > 1 and topo.inter is not None) else None
    if nodes > 1 and net is None:
        raise ValueError(f"inter-node fabric {topo.inter.name if topo.inter else None!r} has no nccl_net section")
    total = S * len(ranks) if kind == "AllGather" else S  # NCCL counts the whole buffer
    c = N.choose(kind, total, len(ranks), nodes, topo.bus_bandwidth(ranks), p, net, requested)
    rails = min(p.channels, len(groups[0])) if (groups and nodes > 1) else 1
    ph = _rail_phases(kind, c.algorithm, ranks, S, groups if nodes > 1 else None, rails, root)
    timing = tuple((0.0, Phase(tuple((s, d, b / c.bw_factor) for s, d, b in q.flows), q.steps)) for q in ph)
    local = max(len(g) for g in groups) if groups else len(ranks)
    floor = N.host_floor(topo.launch, local, topo.intra.call_overhead, p.launch_us * 1e-6)
    return Plan(c.label, c.latency, tuple(ph), timing, floor)


def _rail_orders(ranks, groups, rails):
    """One visiting order per channel: node after node, each node's ranks rotated by the
    channel, so channel c leaves every node through local rank c-1's NIC (rail aligned,
    as NCCL's ring graph on DGX-style nodes)."""
    if groups is None:
        return [list(ranks)]
    return [[g[(c + j) % len(g)] for g in groups for j in range(len(g))] for c in range(rails)]


def _rail_phases(kind, algo, ranks, S, groups, rails, root):
    """Payload flows of a ring or tree collective split over ``rails`` channels (one
    phase: NCCL pipelines the steps; their latency is in the plan's fixed cost)."""
    n = len(ranks)
    flows = []
    for order in _rail_orders(ranks, groups, rails):
        if algo == "tree":
            # NCCL's tree: a chain inside each node, a binary tree over the chains' heads;
            # every edge carries the reduction up and the broadcast down.
            m = len(groups[0]) if groups else n
            chains = [order[i:i + m] for i in range(0, n, m)]
            edges = [e for ch in chains for e in zip(ch, ch[1:])] + _tree_edges([ch[0] for ch in chains])
            flows += [f for a, b in edges for f in ((a, b, S / rails), (b, a, S / rails))]
        elif kind == "Broadcast":
            start = order.index(ranks[0] if root is None else root)
            chain = order[start:] + order[:start]
            flows += [(chain[k], chain[k + 1], S / rails) for k in range(n - 1)]
        else:
            per = {"AllReduce": 2 * (n - 1) / n * S, "ReduceScatter": (n - 1) / n * S,
                   "AllGather": (n - 1) * S}[kind] / rails
            flows += [(order[i], order[(i + 1) % n], per) for i in range(n)]
    return [Phase(tuple(flows), 1)]


def plan_time(pl: Plan, topo) -> float:
    """Time of a plan alone on an idle network."""
    t = pl.fixed + sum(lat + phase_transfer_time(p, topo) for lat, p in pl.timing)
    return max(t, pl.floor)


def closed_form_time(kind: str, algorithm: str, ranks: tuple, nbytes: float, topo, root=None) -> float:
    """Time of one collective alone on an idle network (the closed-form tier)."""
    if len(ranks) <= 1:
        return 0.0
    if _nccl_applies(kind, algorithm, topo):
        return plan_time(plan(kind, ranks, nbytes, topo, algorithm, root), topo)
    ph = phases(kind, algorithm, ranks, nbytes, topo.node_of, root)
    return fixed_cost(kind, ranks, topo) + sum(phase_latency(p, topo) + phase_transfer_time(p, topo) for p in ph)


def choose_algorithm(kind: str, ranks: tuple, nbytes: float, topo, requested: str = "auto") -> str:
    """``requested`` if it applies, else the fastest supported algorithm on an idle network."""
    if requested != "auto":
        return requested if requested in _SUPPORTED[kind] else _SUPPORTED[kind][0]
    memo = topo._auto
    key = (kind, ranks, float(nbytes))
    best = memo.get(key)
    if best is None:
        candidates = [a for a in _SUPPORTED[kind]
                      if not (a == "direct" and len(ranks) > DIRECT_MAX_RANKS and kind != "AllToAll")]
        best = memo[key] = min(
            candidates, key=lambda a: (_alpha_beta_time(kind, a, ranks, nbytes, topo), _SUPPORTED[kind].index(a)))
    return best


def _alpha_beta_time(kind, algorithm, ranks, nbytes, topo):
    ph = phases(kind, algorithm, ranks, nbytes, topo.node_of)
    return fixed_cost(kind, ranks, topo) + sum(phase_latency(p, topo) + phase_transfer_time(p, topo) for p in ph)
