"""The NCCL-derived tier: collectives priced as NCCL runs them, on fabrics whose profile
has an ``nccl`` section.

:mod:`.nccl` holds the tuner's math (algorithm x protocol, channels, latency, launch);
this module lays the chosen algorithm's flows on the topology: rings and trees split
over channels that leave each node through its NICs (rail aligned), NVLS and NVLS-tree
through the switch, point-to-point for all-to-all and send/recv. The flows are timed at
the choice's bandwidth factor, after its latency, and never faster than the host can
launch calls (:func:`.nccl.host_floor`).
"""
from __future__ import annotations

from . import nccl as N
from .plan import Plan
from .schedules import Phase, phases, ranks_by_node, ring_bytes_per_rank, tree_edges


def applies(kind: str, requested: str, topo) -> bool:
    """Where the fabric has an NCCL model: what NCCL runs (its point-to-point path for
    all-to-all and send/recv, ring or tree for the rest); other algorithms go to the
    analytical tier."""
    if topo.intra.nccl is None:
        return False
    if kind in ("AllToAll", "SendRecv"):  # NCCL's point-to-point path, whatever was asked
        return True
    return requested in ("auto", "ring", "tree") and kind in (
        "AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Barrier")


def _nccl_net(topo, crosses: bool, ranks=()):
    """The network's NCCL step latencies when a collective crosses nodes (else None); no
    LL128 across it where the node's PCIe layout forbids it for ``ranks``."""
    if not crosses:
        return None
    net = topo.inter.nccl_net if topo.inter is not None else None
    if net is None:
        raise ValueError(f"inter-node fabric {topo.inter.name if topo.inter else None!r} has no nccl_net section")
    if ranks and not topo.ll128_across_nodes(ranks):
        net = net.model_copy(update={"ll128": False})
    return net


def _net_channels(p, net):
    """The fabric's NCCL model with the network's own per-channel rates where it gives them.
    A ring channel across nodes is one thread block per GPU that also makes the channel's
    NVLink hops, so it moves at the slower of the two rates: a network rate can only
    lower what the node's channels copy."""
    if net is None or not net.channel_GBps:
        return p
    rates = {q: min(v, net.channel_GBps.get(q, v)) for q, v in p.channel_GBps.items()}
    return p.model_copy(update={"channel_GBps": rates})


def _nccl_result(c, ph, topo, local_gpus: int) -> Plan:
    """The plan of an NCCL choice ``c`` over payload phases ``ph``: flows timed at its
    bandwidth factor, its latency first, and the host's launch floor for ``local_gpus``."""
    timing = tuple((0.0, Phase(tuple((s, d, b / c.bw_factor) for s, d, b in q.flows), q.steps)) for q in ph)
    floor = N.host_floor(topo.launch, local_gpus, topo.intra.call_overhead, topo.intra.nccl.launch_s)
    return Plan(c.label, c.latency, tuple(ph), timing, floor)


def _local_gpus(ranks, groups) -> int:
    return max(len(g) for g in groups) if groups else len(ranks)


def _nccl_p2p_plan(kind, ranks, S, topo) -> Plan:
    """NCCL's send/recv (all-to-all is one send and one receive per peer, grouped)."""
    ph = phases(kind, "direct", ranks, S, topo.node_of)
    per_peer = S if kind == "SendRecv" else S / len(ranks)
    cross = any(not topo.same_node(s, d) for q in ph for s, d, _ in q.flows)
    c = N.p2p(per_peer, topo.intra.nccl, _nccl_net(topo, cross),
              topo.intra.bandwidth if not cross else topo.inter.bandwidth)
    local = _local_gpus(ranks, ranks_by_node(ranks, topo.node_of)) if kind == "AllToAll" else 1
    return _nccl_result(c, ph, topo, local)


def plan(kind: str, ranks: tuple, nbytes: float, topo, requested: str = "auto", root=None) -> Plan:
    """The plan of the (algorithm, protocol) NCCL's tuner picks (:func:`.nccl.choose`)."""
    kind, S = ("AllReduce" if kind == "Barrier" else kind), float(nbytes)
    if kind in ("AllToAll", "SendRecv"):
        return _nccl_p2p_plan(kind, ranks, S, topo)
    p = topo.intra.nccl
    groups = ranks_by_node(ranks, topo.node_of)
    nodes = len(groups) if groups else len({topo.node_of[r] for r in ranks})
    total = S * len(ranks) if kind == "AllGather" else S  # NCCL counts the whole buffer
    if nodes > 1 and topo.net_channels(ranks, p.channels) < p.channels:  # fewer NICs than channels
        p = p.model_copy(update={"channels": topo.net_channels(ranks, p.channels)})
    if nodes > 1 and p.nvls_channels and groups is None:  # NVLS-tree needs the same GPUs on every node
        p = p.model_copy(update={"nvls_channels": None})
    net = _nccl_net(topo, nodes > 1, ranks)
    c = N.choose(kind, total, len(ranks), nodes, topo.bus_bandwidth(ranks), _net_channels(p, net), net, requested)
    if c.algorithm == "nvls_tree":
        return _nccl_result(c, _nvls_tree_phases(S, groups, _nvls_heads(topo, groups)), topo,
                            _local_gpus(ranks, groups))
    rails = min(p.channels, len(groups[0])) if (groups and nodes > 1) else 1
    ph = _rail_phases(kind, c.algorithm, ranks, S, groups if nodes > 1 else None, rails, root)
    return _nccl_result(c, ph, topo, _local_gpus(ranks, groups))


def _nvls_heads(topo, groups) -> list[int]:
    """Positions in a node's group of the NVLS-tree heads: the first GPU behind each NIC the
    group reaches (NCCL picks one head per NIC-local GPU, search.cc)."""
    heads, seen = [], set()
    for i, r in enumerate(groups[0]):
        if topo.nic(r) not in seen:
            seen.add(topo.nic(r))
            heads.append(i)
    return heads


def _nvls_tree_phases(S, groups, heads):
    """NVLS-tree's flows, one pipelined phase: inside each node the NVLS traffic ((m + 1) / m
    of the buffer through every port, as :func:`_rail_phases` lays it); across nodes, for
    each head's slice, two binary trees over the nodes (the second over the reversed order),
    half the slice each, every edge carrying it up and back down."""
    flows = []
    for g in groups:
        m = len(g)
        flows += [(g[i], g[(i + 1) % m], (m + 1) / m * S) for i in range(m)]
    per = S / len(heads) / 2
    for h in heads:
        order = [g[h] for g in groups]
        for a, b in tree_edges(order) + tree_edges(order[::-1]):
            flows += [(a, b, per), (b, a, per)]
    return [Phase(tuple(flows), 1)]


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
        if algo == "nvls":
            # Through the switch each port carries (n + 1) / n of the buffer each way; a
            # flow from every rank to the next loads every up and down port by that much.
            flows += [(order[i], order[(i + 1) % n], N.bus_bytes(kind, algo, S, n) / rails) for i in range(n)]
        elif algo == "tree":
            # NCCL's tree: a chain inside each node, a binary tree over the chains' heads;
            # every edge carries the reduction up and the broadcast down.
            m = len(groups[0]) if groups else n
            chains = [order[i:i + m] for i in range(0, n, m)]
            edges = [e for ch in chains for e in zip(ch, ch[1:])] + tree_edges([ch[0] for ch in chains])
            flows += [f for a, b in edges for f in ((a, b, S / rails), (b, a, S / rails))]
        elif kind == "Broadcast":
            start = order.index(ranks[0] if root is None else root)
            chain = order[start:] + order[:start]
            flows += [(chain[k], chain[k + 1], S / rails) for k in range(n - 1)]
        else:
            per = ring_bytes_per_rank(kind, S, n) / rails
            flows += [(order[i], order[(i + 1) % n], per) for i in range(n)]
    return [Phase(tuple(flows), 1)]
