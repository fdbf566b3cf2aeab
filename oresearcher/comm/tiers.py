"""Multi-tier fat trees and rail-optimised networks between the nodes' NICs.

A switch's uplinks are one directional link each way (the bundle, ECMP spreading flows
evenly over its ports), with capacity

    ports_up(t) x bandwidth of the tier's fabric,   ports_up(t) = ports_down(t) / oversubscription(t)

where ``ports_down(1)`` is the NIC ports under a leaf (``group x nics_per_node`` for a
fat tree, ``group`` for a rail leaf, which takes one NIC per node) and ``ports_down(t)``
above is ``group(t)`` times the ports one switch of the tier below sends up (for rail
leaves times the rails too: a spine joins every rail of its node groups). The top tier
is non-blocking. A transfer between nodes climbs from its NIC's leaf to the lowest tier
whose switch both ends share, then comes down: it crosses the uplinks of the sender's
switches below that tier and the downlinks of the receiver's. A fat tree's leaf holds
all NICs of its nodes; a rail leaf holds NIC k of each of its nodes, so traffic from NIC
i to NIC j != i crosses a spine even inside one group.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tier:
    group: int
    oversubscription: float
    bandwidth: float  # bytes/s per uplink port (the tier fabric's, efficiency applied)


def check_tiers(kind: str, tiers: list, nodes: int) -> str | None:
    """Why the tiers cannot be built over ``nodes`` (every switch full), or None."""
    below = nodes
    for i, t in enumerate(tiers):
        if below % t.group:
            what = "nodes" if i == 0 else f"tier {i} switches"
            return f"cluster.network.tiers[{i}].group: {below} {what} do not fill switches of {t.group}"
        below //= t.group
    return None


def uplink_capacities(kind: str, tiers: list, nics_per_node: int) -> list[float]:
    """Bytes/s of one switch's uplink bundle (each direction) at each tier, leaves first."""
    caps, ports = [], None
    for i, t in enumerate(tiers):
        if i == 0:
            down = t.group * (nics_per_node if kind == "fat-tree" else 1)
        else:
            down = t.group * ports * (nics_per_node if kind == "rail-optimised" and i == 1 else 1)
        ports = down / t.oversubscription
        caps.append(ports * t.bandwidth)
    return caps


def switch_ids(kind: str, tiers: list, node: int, nic: int) -> list:
    """The switch a NIC reaches at each listed tier (ids unique within a tier)."""
    ids, pod = [], node // tiers[0].group
    ids.append((pod, nic) if kind == "rail-optimised" else pod)
    for t in tiers[1:]:
        pod //= t.group
        ids.append(pod)
    return ids


class TierNetwork:
    """The uplink and downlink link ids of every switch, and the path between two NICs."""

    def __init__(self, kind: str, tiers: list, add_link, nodes: int, nics_per_node: int):
        self.kind, self.tiers = kind, tiers
        caps = uplink_capacities(kind, tiers, nics_per_node)
        self.up, self.down = [], []  # per tier: switch id -> link id
        for t, cap in enumerate(caps):
            ids = sorted({tuple(switch_ids(kind, tiers, n, k))[t] for n in range(nodes) for k in range(nics_per_node)},
                         key=str)
            self.up.append({s: add_link(f"t{t + 1}.{s}.up", cap) for s in ids})
            self.down.append({s: add_link(f"t{t + 1}.{s}.down", cap) for s in ids})

    def path(self, node_a: int, nic_a: int, node_b: int, nic_b: int) -> tuple:
        """Switch links between NIC (node_a, nic_a) and NIC (node_b, nic_b), in order."""
        a = switch_ids(self.kind, self.tiers, node_a, nic_a)
        b = switch_ids(self.kind, self.tiers, node_b, nic_b)
        top = next((t for t in range(len(a)) if a[t] == b[t]), len(a))  # the lowest shared tier
        return (*(self.up[t][a[t]] for t in range(top)), *(self.down[t][b[t]] for t in reversed(range(top))))
