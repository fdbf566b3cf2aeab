"""What a node's PCIe layout decides for traffic between nodes, as NCCL decides it (pure).

The layout (:class:`oresearcher.hardware.node.NodeLayout`) says which GPUs and NICs share
a PCIe switch complex. From it, following NCCL 2.8.4's ``src/graph/paths.cc`` and
``src/graph/tuning.cc``:

- **Which NIC a GPU uses:** the closest one (NCCL's ring search prefers the NIC with the best
  path); GPUs sharing a complex with several NICs take them in turn (rail alignment).
- **Path type** GPU -> NIC: the complex's own (PIX, one switch; PXB, several switches) when
  both sit in it; PHB through the CPU's host bridge when the complexes hang off one socket;
  SYS across sockets (``nvidia-smi topo -m``'s classes).
- **GPUDirect RDMA** (``ncclTopoCheckGdr``): on when the NIC supports it and the path is no
  worse than ``NCCL_NET_GDR_LEVEL`` (default PXB). Off, NCCL stages the data in host
  memory: GPU -> host -> NIC when sending, NIC -> host -> GPU when receiving, so each
  byte crosses the switch uplinks to the CPU root (up once, down once) on both nodes,
  where the two GPUs and the NIC of a complex share them (:func:`host_hops`). GDR on but a
  path through the host bridge (a GDR level raised to PHB or SYS) crosses the same links.
- **LL128 across nodes** (``ncclTopoTuneModel``): only when the ring's GPU-to-NIC path
  type is at most PXB (``graphs[a]->typeInter <= PATH_PXB``).

Not modelled: the CPU-to-CPU link a SYS path also crosses, and PXN (NCCL 2.12+ moves data
over NVLink to a GPU next to the NIC when the NIC is far).
"""
from __future__ import annotations

# NCCL's path types, best first (src/include/graph.h, NCCL 2.8.4: LOC, NVL, NVB, PIX, PXB,
# PHB, SYS): the order NCCL_NET_GDR_LEVEL compares against.
PATH_TYPES = ("LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS")
P2P_UNDER_SWITCH = "PXB"  # paths up to here stay below the CPU root (peer to peer in the switch)
LL128_NET_MAX = "PXB"  # tuning.cc (NCCL 2.8.4): LL128 only where typeInter <= PATH_PXB


def worse(a: str, b: str) -> bool:
    """Path type ``a`` is farther than ``b`` in NCCL's order."""
    return PATH_TYPES.index(a) > PATH_TYPES.index(b)


def nic_of(layout, gpu: int) -> int:
    """The NIC local GPU ``gpu`` uses: its complex's NICs in turn, else the nearest by path
    (the lowest-numbered NIC among the nearest)."""
    sw = layout.switches[layout.switch_of("gpus", gpu)]
    if sw.nics:
        return sw.nics[sw.gpus.index(gpu) % len(sw.nics)]
    return min(range(layout.nics), key=lambda k: (PATH_TYPES.index(path_type(layout, gpu, k)), k))


def path_type(layout, gpu: int, nic: int) -> str:
    """NCCL's path type from GPU ``gpu`` to NIC ``nic`` of one node."""
    g, k = layout.switch_of("gpus", gpu), layout.switch_of("nics", nic)
    if g == k:
        return layout.switches[g].path
    return "PHB" if layout.switches[g].cpu == layout.switches[k].cpu else "SYS"


def gdr(layout, gpu: int, nic: int, level: str = "PXB") -> bool:
    """GPUDirect RDMA between ``gpu`` and ``nic`` at NCCL_NET_GDR_LEVEL ``level``."""
    return layout.gdr and not worse(path_type(layout, gpu, nic), level)


def through_host(layout, gpu: int, level: str = "PXB") -> bool:
    """Whether ``gpu``'s network traffic crosses its complexes' uplinks to the CPU."""
    nic = nic_of(layout, gpu)
    return not gdr(layout, gpu, nic, level) or worse(path_type(layout, gpu, nic), P2P_UNDER_SWITCH)


def host_hops(layout, gpu: int, sending: bool) -> tuple[tuple[int, str], ...]:
    """The uplinks (switch index, 'up' or 'down') a byte crosses between ``gpu`` and its
    NIC through host memory: sending, up from the GPU's complex and down into the NIC's;
    receiving, up from the NIC's and down into the GPU's."""
    g, k = layout.switch_of("gpus", gpu), layout.switch_of("nics", nic_of(layout, gpu))
    return ((g, "up"), (k, "down")) if sending else ((k, "up"), (g, "down"))


def ll128_across_nodes(layout, gpus) -> bool:
    """LL128 may cross the network: every one of ``gpus``' NIC paths at most PXB."""
    return all(not worse(path_type(layout, g, nic_of(layout, g)), LL128_NET_MAX) for g in gpus)


def nic_Bps(layout, nic: int, nic_Bps_: float, level: str = "PXB") -> float:
    """What NIC ``nic`` can carry each way with its GPUs' traffic: its link, or where that
    traffic goes through host memory, half its complex's uplink (every byte sent and
    every byte received crosses it once in each direction)."""
    users = [g for g in range(layout.gpus) if nic_of(layout, g) == nic]
    if not any(through_host(layout, g, level) for g in users):
        return nic_Bps_
    return min(nic_Bps_, layout.uplink_Bps(layout.switch_of("nics", nic)) / 2)
