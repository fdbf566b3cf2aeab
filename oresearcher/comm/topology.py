"""Cluster topology: the links, and the route a byte takes from one rank to another.

Rank r sits on node ``r // gpus_per_node`` (agents fill the first GPUs). Links are
directional with a capacity in bytes/s (already times the fabric's efficiency):

- switch (NVSwitch, loopback): every rank has an up and a down port into a non-blocking
  switch; a -> b on one node crosses ``up[a], down[b]``.
- pcie: the same ports, plus one shared host-bridge link per node that every
  intra-node transfer crosses (PCIe peers share the root complex).
- multi-node: each node has ``nics_per_node`` NICs, each with an up and a down link into
  a non-blocking fat tree. Local GPU i uses NIC ``i * nics // gpus_per_node`` (rail
  alignment, as DGX nodes pair GPUs and NICs); a -> b across nodes crosses
  ``nic_up[node(a), nic(a)], nic_down[node(b), nic(b)]``.

GPU-to-NIC affinity: with fewer NICs than GPUs, the GPUs that use one NIC sit with it on one
PCIe switch (HGX A100 boards with 4 NICs: two GPUs and one NIC per switch), so GPUDirect RDMA
stays under the switch and the NIC's link is what they share (:meth:`Topology.nic_groups`).
NCCL's channels across nodes follow the NICs (:meth:`Topology.net_channels`). Where the
cluster gives the node's PCIe layout (``layout``), the layout says which NIC a GPU uses and
whether its network bytes go through host memory; those then also cross their PCIe
complexes' uplinks to the CPU (``n{node}.pcie{k}.up|down``), shared by the complex's GPUs
and NICs (:mod:`.pcie`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from . import pcie
from .tiers import TierNetwork


@dataclass
class Topology:
    world_size: int
    gpus_per_node: int
    intra: "FabricProfile"  # oresearcher.hardware's, SI properties (bandwidth, hop_latency, ...)
    inter: Optional["FabricProfile"] = None
    nics_per_node: int = 1
    launch: str = "per-process"  # NCCL host side: one process per GPU, or one driving all ("single-process")
    network: Optional[tuple] = None  # (kind, [tiers.Tier]) switches between the NICs; None: one flat switch
    layout: Optional["NodeLayout"] = None  # the node's PCIe layout (hardware/node.py); None: GDR under one switch
    gdr_level: str = "PXB"  # NCCL_NET_GDR_LEVEL: GPUDirect RDMA up to this path type (.pcie)
    capacity: list = field(default_factory=list)  # bytes/s per link
    names: list = field(default_factory=list)
    _routes: dict = field(default_factory=dict)
    _auto: dict = field(default_factory=dict)  # (kind, ranks, bytes) -> algorithm 'auto' chose

    def __post_init__(self):
        g = self.gpus_per_node
        self.nodes = (self.world_size + g - 1) // g
        self.node_of = [r // g for r in range(self.world_size)]
        self.up = [self._link(f"r{r}.up", self.intra.bandwidth) for r in range(self.world_size)]
        self.down = [self._link(f"r{r}.down", self.intra.bandwidth) for r in range(self.world_size)]
        self.bridge = []
        if self.intra.topology == "pcie" and self.intra.shared_bandwidth:
            self.bridge = [self._link(f"n{n}.bridge", self.intra.shared_bandwidth) for n in range(self.nodes)]
        self.nic_up, self.nic_down = {}, {}
        if self.nodes > 1:
            if self.inter is None:
                raise ValueError("multi-node topology needs an inter-node fabric")
            for n in range(self.nodes):
                for k in range(self.nics_per_node):
                    self.nic_up[n, k] = self._link(f"n{n}.nic{k}.up", self.inter.bandwidth)
                    self.nic_down[n, k] = self._link(f"n{n}.nic{k}.down", self.inter.bandwidth)
        self.uplink = {}  # (node, PCIe complex, 'up' | 'down') -> link: crossed through host memory (.pcie)
        if self.layout is not None and self.nodes > 1:
            for n in range(self.nodes):
                for k in range(len(self.layout.switches)):
                    for d in ("up", "down"):
                        self.uplink[n, k, d] = self._link(f"n{n}.pcie{k}.{d}", self.layout.uplink_Bps(k))
        self.switches = None  # .tiers: multi-tier fat tree or rail-optimised network
        if self.network is not None and self.nodes > 1:
            self.switches = TierNetwork(*self.network, self._link, self.nodes, self.nics_per_node)

    def _link(self, name: str, capacity: float) -> int:
        self.names.append(name)
        self.capacity.append(float(capacity))
        return len(self.capacity) - 1

    def nic(self, rank: int) -> int:
        if self.layout is not None:
            return pcie.nic_of(self.layout, rank % self.gpus_per_node)
        return (rank % self.gpus_per_node) * self.nics_per_node // self.gpus_per_node

    def _host_hops(self, rank: int, sending: bool) -> tuple:
        """Uplink ids ``rank``'s network bytes cross through host memory (none with GDR under a switch)."""
        if self.layout is None or not pcie.through_host(self.layout, rank % self.gpus_per_node, self.gdr_level):
            return ()
        n = self.node_of[rank]
        return tuple(self.uplink[n, k, d] for k, d in pcie.host_hops(self.layout, rank % self.gpus_per_node, sending))

    def ll128_across_nodes(self, ranks) -> bool:
        """NCCL lets LL128 cross the network for ``ranks`` (every NIC path at most PXB)."""
        if self.layout is None:
            return True
        return pcie.ll128_across_nodes(self.layout, sorted({r % self.gpus_per_node for r in ranks}))

    def nic_groups(self) -> list[list[int]]:
        """Local GPU indices behind each NIC of a node (those GPUs share the NIC and its
        PCIe switch); a NIC no GPU maps to (more NICs than GPUs) is left out."""
        groups = {}
        for i in range(self.gpus_per_node):
            groups.setdefault(self.nic(i), []).append(i)
        return [groups[k] for k in sorted(groups)]

    def nics_reached(self, ranks) -> int:
        """NICs the ranks of ``ranks[0]``'s node use."""
        return len({self.nic(r) for r in ranks if self.node_of[r] == self.node_of[ranks[0]]})

    def net_channels(self, ranks, channels: int) -> int:
        """Channels NCCL runs a collective on across nodes: its network graph search gives
        one ring or tree per NIC a node's GPUs reach (search.cc, ncclTopoSearchRecNet) and
        ncclTopoPreset duplicates them (connect.cc); at most the fabric's ``channels``."""
        return min(channels, 2 * self.nics_reached(ranks))

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of[a] == self.node_of[b]

    def route(self, src: int, dst: int) -> tuple:
        """Link ids a transfer from ``src`` to ``dst`` crosses (empty for src == dst)."""
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            if src == dst:
                r = ()
            elif self.same_node(src, dst):
                mid = (self.bridge[self.node_of[src]],) if self.bridge else ()
                r = (self.up[src], *mid, self.down[dst])
            else:
                a, b = (self.node_of[src], self.nic(src)), (self.node_of[dst], self.nic(dst))
                mid = self.switches.path(*a, *b) if self.switches is not None else ()
                r = (*self._host_hops(src, True), self.nic_up[a], *mid, self.nic_down[b], *self._host_hops(dst, False))
            self._routes[key] = r
        return r

    def hop_latency(self, src: int, dst: int) -> float:
        return self.intra.hop_latency if self.same_node(src, dst) else self.inter.hop_latency

    def bus_bandwidth(self, ranks) -> float:
        """Bytes/s a ring over ``ranks`` can push through its busiest link: a GPU port,
        or across nodes the NICs the node's ranks reach (rail-aligned)."""
        bw = self.intra.bandwidth
        first = [r for r in ranks if self.node_of[r] == self.node_of[ranks[0]]]
        if self.inter is not None and len(first) < len(ranks):
            nics = {self.nic(r) for r in first}
            if self.layout is None:
                return min(bw, len(nics) * self.inter.bandwidth)
            return min(bw, sum(pcie.nic_Bps(self.layout, k, self.inter.bandwidth, self.gdr_level) for k in nics))
        return bw

    def protocol(self, ranks) -> "FabricProfile":
        """The fabric whose protocol costs a collective over ``ranks`` pays."""
        if self.inter is not None and len({self.node_of[r] for r in ranks}) > 1:
            return self.inter
        return self.intra


def build_topology(world_size: int, gpus_per_node: int, intra: "FabricProfile",
                   inter: Optional["FabricProfile"] = None, nics_per_node: int = 1,
                   launch: str = "per-process", network: Optional[tuple] = None,
                   node_pcie: Optional[tuple] = None) -> Topology:
    """A topology; ``node_pcie`` is (the node's PCIe layout, NCCL_NET_GDR_LEVEL), the layout
    with ``gpus_per_node`` GPUs and ``nics_per_node`` NICs."""
    layout, gdr_level = node_pcie or (None, "PXB")
    if launch not in ("per-process", "single-process"):
        raise ValueError(f"launch must be per-process or single-process, got {launch!r}")
    if layout is not None and (layout.gpus, layout.nics) != (gpus_per_node, nics_per_node):
        raise ValueError(f"node layout {layout.name!r} has {layout.gpus} GPUs and {layout.nics} NICs; the cluster "
                         f"has {gpus_per_node} GPUs and {nics_per_node} NICs per node")
    if gdr_level not in pcie.PATH_TYPES:
        raise ValueError(f"gdr_level must be one of {', '.join(pcie.PATH_TYPES)}, got {gdr_level!r}")
    return Topology(world_size, gpus_per_node, intra, inter, nics_per_node, launch, network=network,
                    layout=layout, gdr_level=gdr_level)
