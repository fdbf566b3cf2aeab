"""Collective schedules: the one place the ring, tree, all-pairs, halving-doubling and
hierarchical formulas live.

Pure math on rank ids and byte counts (no SimPy, no torch.distributed): the tiers of
:mod:`oresearcher.comm` price these schedules, :mod:`.wire` counts their wire bytes,
calibration fits :func:`ring_terms`, the codecs' exchanges use :func:`ring_bytes_per_rank`,
and nccl-tests' bus bandwidth uses :func:`bus_factor`.

A collective over ``ranks`` with per-rank payload ``nbytes`` becomes a list of
:class:`Phase`. A phase is a set of flows that run at the same time plus the number of
sequential algorithm steps it takes. A ring all-reduce's 2(n-1) steps each move S/n
bytes per rank at the same time, so they are one phase of 2(n-1)/n * S bytes per rank
with 2(n-1) steps: the same bandwidth and latency terms as Thakur, Rabenseifner & Gropp,
"Optimization of Collective Communication Operations in MPICH" (IJHPCA 2005).

Payload convention (``nbytes``, per rank, what the op's input holds):
AllReduce/ReduceScatter/Broadcast: the tensor; AllGather: this rank's contribution;
AllToAll: the sum of the tensors this rank sends. An algorithm that does not apply to an
op (tree reduce-scatter, halving-doubling on a non-power-of-two group) falls back to ring.
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AllToAll")  # the ring model's


def ring_steps(kind: str, n: int) -> int:
    """Sequential steps of the ring algorithm for ``kind`` on ``n`` ranks."""
    return 2 * (n - 1) if kind == "AllReduce" else n - 1


def ring_share(kind: str, n: int) -> float:
    """The peer term: the share of the whole buffer each rank sends in a ring, 2(n-1)/n for
    an all-reduce (reduce-scatter then all-gather), (n-1)/n for the others: every rank
    keeps its own 1/n."""
    return 2 * (n - 1) / n if kind == "AllReduce" else (n - 1) / n


def ring_bytes_per_rank(kind: str, nbytes: float, n: int) -> float:
    """Bytes each rank sends in the ring algorithm (payload convention above)."""
    if n <= 1:
        return 0.0
    if kind in ("AllReduce", "ReduceScatter"):
        return ring_share(kind, n) * nbytes
    if kind == "AllGather":
        return (n - 1) * nbytes
    if kind == "Broadcast":
        return nbytes  # a pipelined chain: every rank but the last forwards the tensor
    raise ValueError(f"no ring for {kind}")


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``kind`` (doc/PERFORMANCE.md): the share of the whole
    buffer that crosses each rank's link."""
    return 1.0 if kind == "Broadcast" else ring_share(kind, n)


def ring_terms(kind: str, n: int) -> tuple[float, float]:
    """(steps, bytes sent per byte of the whole buffer) of the ring for ``kind``: what the
    calibration fits its latency and bandwidth to (a broadcast counted as (n-1)/n, as the
    shipped calibrated profiles were fitted)."""
    if n <= 1:
        return 0.0, 0.0
    if kind not in KINDS:
        raise ValueError(f"no ring model for {kind}")
    return float(ring_steps(kind, n)), float(ring_share(kind, n))


def ring_time(kind: str, nbytes: float, n: int, fixed_s: float, hop_s: float, bandwidth_Bps: float) -> float:
    """The ring's alpha-beta time on a uniform link: ``fixed + steps x hop + share x S / bw``
    (:func:`ring_terms`; ``nbytes`` the whole buffer): the calibration's model."""
    hops, factor = ring_terms(kind, n)
    return fixed_s + hops * hop_s + factor * nbytes / bandwidth_Bps


# 'auto' considers all-pairs ("direct") algorithms only up to this group size: one
# NVSwitch domain. Beyond it they mean n^2 flows, which no library uses at scale.
DIRECT_MAX_RANKS = 16
# The schedules this module lays out; a scenario asks for one of them or for "auto"
# (the fastest on an idle network, or NCCL's tuner where the fabric has an NCCL model).
ALGORITHMS = ("ring", "tree", "direct", "halving_doubling", "hierarchical")
ALGORITHM_CHOICES = ("auto", *ALGORITHMS)
SUPPORTED = {
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


def ranks_by_node(ranks, node_of):
    """Ranks grouped per node, or None when nodes hold unequal numbers of them."""
    nodes = {}
    for r in ranks:
        nodes.setdefault(node_of[r], []).append(r)
    groups = list(nodes.values())
    if len({len(g) for g in groups}) != 1:
        return None
    return groups


def tree_edges(order):
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
    groups = ranks_by_node(ranks, node_of)
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
    if algorithm not in SUPPORTED[kind] or (algorithm == "halving_doubling" and not _is_pow2(n)):
        algorithm = SUPPORTED[kind][0]
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
            return [Phase(_ring_flows(ranks, ring_bytes_per_rank(kind, S, n)), ring_steps(kind, n))]
        if algorithm == "direct":
            return [Phase(_pairs(ranks, S / n), 1), Phase(_pairs(ranks, S / n), 1)]
        if algorithm == "halving_doubling":
            return _halving(ranks, S) + _halving(ranks, S, reverse=True)
        # double binary tree (NCCL 2.4): two heap trees, the second mirrored so most
        # interior nodes of one are leaves of the other; each carries half the data
        # up (reduce) and down (broadcast), pipelined.
        flows = []
        for order in (list(ranks), list(ranks)[::-1]):
            for p, c in tree_edges(order):
                flows += [(c, p, S / 2), (p, c, S / 2)]
        return [Phase(tuple(flows), 2 * _depth(n))]
    if kind == "ReduceScatter":
        if algorithm == "ring":
            return [Phase(_ring_flows(ranks, ring_bytes_per_rank(kind, S, n)), ring_steps(kind, n))]
        if algorithm == "direct":
            return [Phase(_pairs(ranks, S / n), 1)]
        return _halving(ranks, S)
    if kind == "AllGather":
        if algorithm == "ring":
            return [Phase(_ring_flows(ranks, ring_bytes_per_rank(kind, S, n)), ring_steps(kind, n))]
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
        return [Phase(tuple((p, c, S) for p, c in tree_edges(order)), _depth(n))]
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
