"""How NCCL moves a collective: algorithm x protocol, channels, latency, launch (pure math).

The alpha-beta tier (:mod:`.alpha_beta`) prices a collective from link bandwidth and a
latency per algorithm step. NCCL is not that simple in the range where gradient buckets
live (64 KiB - 32 MiB), and this module adds what it does, from its public source
(``src/graph/tuning.cc`` and ``src/enqueue.cc``, NCCL 2.8-2.18):

- **Protocols.** LL sends 8 bytes of data with an 8-byte flag per 16-byte store (low
  latency, a fraction of the link); LL128 carries 120 of every 128 bytes; Simple uses
  the whole link but synchronises through memory fences, so each step costs more.
  NCCL's tuner gives each (algorithm, protocol) a latency ``base + steps x hop`` and a
  bus bandwidth ``link x fraction``; it runs the pair with the smallest
  ``latency + bytes / algbw`` (:func:`choose`). So do we.
- **Channels.** A ring runs on ``channels`` parallel rings (one CUDA block each). For a
  small message NCCL uses fewer channels and threads: ``while nbytes < nc * nt *
  threshold`` drop a channel, then halve the threads (enqueue.cc, getAlgoInfo). A
  message on fewer channels gets that share of the bus bandwidth (:func:`channels_used`).
- **Slices.** The Simple ring sends each step's chunk as 2 slices (collectives.h,
  ``CHUNKSTEPS / SLICESTEPS``), each behind its own flag wait; the tuner counts one hop
  per step. Achieved, the step latencies count once per slice (:func:`slices_per_chunk`):
  what keeps 16-32 MiB all-reduces on 8 A100s at ~235 and ~370 us where one hop per step
  gives 188 and 313 (mid sizes keep all 12 channels: 16 MiB is 43 x enqueue.cc's
  12 x 512 x 64 B threshold).
- **Launch.** nccl-tests issues collectives back to back; the host enqueues while the
  GPU runs the previous one, so a call costs ``max(host, kernel)``. With one process per
  GPU the host side is one call; with one process driving all GPUs of a node (``-g 8``)
  it launches one kernel per GPU in turn (:func:`host_floor`).

- **What a channel copies.** A channel is one thread block; it moves at most
  ``channel_GBps[protocol]`` however fast the link is. On NVLink this, not the link,
  limits LL and LL128; on a 100-200 Gb/s NIC the link does.

Where constants live: what differs between machines (channels, per-protocol latencies
and channel rates, launch and kernel costs, tree caps) is in the fabric profile with its
source; what NCCL's tuner applies on every machine alike (LL's 1/4 of the link, LL128's
120/128, the tree's 0.9, the ring plateau's x1.9) is part of its algorithm and stays
here, next to the tuning.cc line it comes from.

Units: the profile's tables are in tuning.cc's units, microseconds and GB/s. A latency is
summed in the table's microseconds and leaves a function in seconds through
:func:`~.units.us_to_s`; a channel or cap rate becomes bytes/s through
:func:`~.units.GBps_to_Bps` where it is read (SI everywhere else).

- **NVLS** (NVLink SHARP, NVSwitch 3 on HGX H100/H200): the switch reduces. Each GPU
  scatters its buffer into the switch's multicast memory; one rank per slice (a *head*)
  loads the slice reduced by the switch (``multimem.ld_reduce``) and stores the result to
  every GPU at once (``multimem.st``). Per GPU port and direction that is the whole buffer
  plus the slice it heads: ``(n + 1) / n x S`` (search.cc counts a channel's head twice and
  every other GPU once), against ``2 (n - 1) / n x S`` for a ring. NCCL's tuner derates
  the result to 5/6 (tuning.cc; 2.17-2.18 apply 0.75 to the port, the same at n = 8). The
  kernel is a pipeline over ``channels x heads`` slices of ``chunk`` bytes, the chunk set
  by the message size (enqueue.cc: 16 KiB below 2 x, 32 KiB below 8 x, 64 KiB below 64 x
  the 128 KiB x slices bytes); a slice is reduced only once every GPU has scattered its
  first chunk, so one chunk's time fills the pipeline before the links stream
  (:func:`nvls_fill`). Across nodes NCCL runs **NVLS-tree**: the same in-switch reduction
  inside each node, and for each head's slice a tree over the nodes through the head's NIC
  (two binary trees, half the slice each, as NCCL's double binary tree), then the
  multicast store. A node's NICs carry the whole buffer each way on two nodes, twice that
  on more (tuning.cc halves the network bandwidth past two nodes). NVLS is modelled for
  all-reduce only.

Measured constants, and why (in the fabric profile, with their source): NCCL's latency
table ranks choices and leaves out the kernel's fixed cost; ``kernel_overhead_us`` is
the published 8-byte latency minus the table's. LL and LL128 channel rates are half of
what the tuner assumes (a block polls flags and reduces in one pass). These are read
off one reference (ABCI, NCCL 2.8) and checked against the others
(tests/sim/test_nccl.py, benchmarks/bench_collectives.py). The tuner still chooses by its
own table, as NCCL does; only the time of its choice uses the measured constants.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import schedules
from .units import GBps_to_Bps, us_to_s

PROTOCOLS = ("LL", "LL128", "Simple")
# NVLS: the tuner's derating of the links' rate (tuning.cc, "ratio *= 5.0/6.0"), the
# largest chunk of one slice (enqueue.cc), and the chunk ladder below it.
NVLS_EFFICIENCY = 5 / 6
NVLS_MAX_CHUNK = 131072
NVLS_CHUNK_STEPS = ((64, 65536), (8, 32768), (2, 16384))
# NVLS-tree starts from Simple's chunk (NCCL_BUFFSIZE 4 MiB / 8 steps x 4 steps a chunk) and
# takes its own ladder (enqueue.cc)
SIMPLE_CHUNK = 4 * 2**20 // 8 * 4
# Simple's ring chunk and slice, in FIFO steps of NCCL_STEPS = 8 (collectives.h, NCCL 2.8.4:
# ALLREDUCE_CHUNKSTEPS = NCCL_STEPS / 2, ALLREDUCE_SLICESTEPS = NCCL_STEPS / 4)
SIMPLE_CHUNK_STEPS, SIMPLE_SLICE_STEPS = 4, 2
NVLS_TREE_CHUNK_STEPS = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))


@dataclass(frozen=True)
class Choice:
    algorithm: str  # "ring", "tree" or "nvls"
    protocol: str  # one of PROTOCOLS
    channels: int  # channels this message runs on
    threads: int  # threads per channel
    latency: float  # seconds: protocol start-up plus per-step latencies
    bw_factor: float  # achieved bus bandwidth / the links' bandwidth

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def ring_hops(kind: str, n: int, nodes: int) -> tuple[int, int]:
    """(algorithm steps, of which cross a node boundary) of a ring (tuning.cc)."""
    return schedules.ring_steps(kind, n), schedules.ring_steps(kind, nodes)


def slices_per_chunk(kind: str, proto: str) -> int:
    """Synchronisations per ring step: NCCL's Simple ring moves each step's chunk as
    ``CHUNKSTEPS / SLICESTEPS`` slices, each behind its own flag wait (NCCL 2.8.4
    src/include/collectives.h: all-reduce, all-gather and reduce-scatter 4 / 2 = 2;
    broadcast 1 / 1). The tuner counts one hop per step; the kernel waits once per slice.
    Across loops the FIFO (8 steps = 4 slices) hides the waits behind the previous
    loop's data, so the first loop's, counted here once, are what mid sizes pay."""
    if proto != "Simple" or kind not in ("AllReduce", "AllGather", "ReduceScatter"):
        return 1
    return SIMPLE_CHUNK_STEPS // SIMPLE_SLICE_STEPS


def channels_used(nbytes: float, proto: str, nranks: int, p) -> tuple[int, int]:
    """(channels, threads per channel) NCCL gives a message of ``nbytes`` (enqueue.cc):
    each thread gets at least ``threshold`` bytes (x ranks for ring LL)."""
    nc, nt = p.channels, p.threads[proto]
    thr = p.thread_threshold[proto] * (nranks if proto == "LL" else 1)
    while nbytes < nc * nt * thr:
        if nc >= 2:
            nc -= 1
        elif nt % 128 == 0:
            nt //= 2
        else:
            break
    return nc, nt


def protocol_fraction(kind: str, algo: str, proto: str, nodes: int, ppn: int, nbytes: float, p) -> float:
    """The tuner's bus-bandwidth fraction of the links for (algorithm, protocol)
    (tuning.cc, 'various model refinements'), with its tree correction for mid sizes."""
    if proto == "Simple":
        f = 1.0
    elif proto == "LL":
        f = 1 / 3.8 if algo == "tree" else (1 / 4 if (nodes > 1 or kind == "AllReduce") else 1 / 3)
    elif algo == "ring":  # LL128 carries 120 of every 128 bytes
        f = 0.7 if ppn < 2 else 0.92
    else:
        f = 7 / 9 if nodes == 1 else 0.915
    if algo == "tree":
        log_size = int(math.log2(max(nbytes, 64) / 64))
        f *= 0.9 * (p.tree_correction[proto][log_size] if log_size < len(p.tree_correction[proto]) else 1.0)
    return f


def bandwidth(kind: str, algo: str, proto: str, nbytes: float, n: int, nodes: int, link_Bps: float, p,
              nc: int, nt: int, tuner: bool = False) -> float:
    """Bus bandwidth (bytes/s) a message gets: the protocol's share of the links, at most
    what its ``nc`` channels of ``nt`` threads copy (a channel is one thread block;
    below ``saturating_threads`` it slows in proportion); trees at most their cap."""
    links = link_Bps * protocol_fraction(kind, algo, proto, nodes, n // nodes, nbytes, p)
    if algo == "tree":
        links = min(links, GBps_to_Bps(p.tree_busbw_cap_GBps[proto]))
    if tuner:  # what NCCL's tuner assumes: every channel, its per-channel ceilings
        return min(links, GBps_to_Bps(p.channels * p.tuner_channel_GBps[proto]))
    blocks = GBps_to_Bps(nc * p.channel_GBps[proto]) * min(1.0, nt / p.saturating_threads)
    return min(links, blocks)


def latency(kind: str, algo: str, proto: str, n: int, nodes: int, p, net=None, nbytes: float = 0.0,
            tuner: bool = False) -> float:
    """Seconds of start-up and per-step latency (tuning.cc), plus the kernel's fixed
    cost the tuner leaves out (``kernel_overhead_us``, measured) unless ``tuner``.

    Ring: ``base + (steps - inter) x intra_hop + inter x net_hop``, LL's intra hop x1.8
    across nodes, and x1.9 for Simple all-reduce across nodes past the ring's plateau
    size. Tree: ``base + 2 x ((ppn - 1) x intra_hop + log2(nodes) x net_hop)``.
    """
    hops = p.ring_hop_latency_us if algo == "ring" else p.tree_hop_latency_us
    intra = hops[proto] * (1.8 if nodes > 1 and proto == "LL" else 1.0)
    inter = 0.0
    if nodes > 1:
        inter = (net.ring_hop_latency_us if algo == "ring" else net.tree_hop_latency_us)[proto]
    if algo == "ring":
        steps, cross = ring_hops(kind, n, nodes)
        syncs = 1 if tuner else slices_per_chunk(kind, proto)
        local = p.base_latency_us[proto] + syncs * (steps - cross) * intra
        net_part = syncs * cross * inter
        if proto == "Simple" and nodes > 1 and kind == "AllReduce" and nbytes >= n / 16 * 65536:
            local, net_part = local * 1.9, net_part * 1.9  # "plateau effect of ring" (tuning.cc)
    else:
        local = p.tree_base_latency_us[proto] + 2 * (n // nodes - 1) * intra
        net_part = 2 * math.log2(nodes) * inter
    return us_to_s(local + net_part + (0.0 if tuner else p.kernel_overhead_us))


def candidates(kind: str, nodes: int, p=None, net=None) -> tuple[str, ...]:
    """Algorithms NCCL runs for a collective: tree only for all-reduce (NCCL 2.8-2.18);
    where the fabric's switch reduces (``p.nvls_channels``), NVLS for a one-node all-reduce
    and NVLS-tree across nodes (given the network's NVLS-tree step latency)."""
    if kind != "AllReduce":
        return ("ring",)
    if p is not None and p.nvls_channels:
        if nodes == 1:
            return ("ring", "tree", "nvls")
        if net is not None and net.nvls_tree_hop_latency_us is not None:
            return ("ring", "tree", "nvls_tree")
    return ("ring", "tree")


def protocols(algo: str, net=None) -> tuple[str, ...]:
    """NVLS and NVLS-tree run the Simple protocol only (tuning.cc); across a network that
    does not allow it (``net.ll128`` False: a GPU-to-NIC path beyond PXB), no LL128."""
    if algo in ("nvls", "nvls_tree"):
        return ("Simple",)
    return tuple(q for q in PROTOCOLS if q != "LL128") if (net is not None and not net.ll128) else PROTOCOLS


def nvls_chunk(nbytes: float, slices: int, algo: str = "nvls") -> int:
    """Bytes of one NVLS chunk for an ``nbytes`` all-reduce over ``slices`` = channels x
    heads pipelines (enqueue.cc): 128 KiB (NVLS-tree: Simple's 2 MiB), smaller while the
    message is small beside it."""
    chunk, steps = ((NVLS_MAX_CHUNK, NVLS_CHUNK_STEPS) if algo == "nvls"
                    else (SIMPLE_CHUNK, NVLS_TREE_CHUNK_STEPS))
    for times, smaller in steps:
        if nbytes < times * slices * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_fill(nbytes: float, n: int, link_Bps: float, p, algo: str = "nvls") -> float:
    """Seconds before the NVLS pipeline streams: one chunk through each of the
    ``channels x n`` slices (``n`` GPUs of a node) at the achieved rate (the whole
    buffer's bytes per port are (n + 1) / n of it, at :data:`NVLS_EFFICIENCY` of the link)."""
    slices = p.nvls_channels * n
    return slices * nvls_chunk(nbytes, slices, algo) * bus_bytes("AllReduce", "nvls", 1.0, n) / (
        link_Bps * NVLS_EFFICIENCY)


def _nvls_estimate(algo: str, nbytes: float, n: int, nodes: int, link_Bps: float, p, net,
                   tuner: bool) -> Choice:
    """NVLS or NVLS-tree (Simple): the tuner's latency (NVLS-tree: plus two network steps
    per tree level); achieved, the kernel's fixed cost and the pipeline's fill on top.
    Both move their bus bytes at 5/6 of the link."""
    lat = p.nvls_latency_us
    if algo == "nvls_tree":
        lat += 2 * math.log2(nodes) * net.nvls_tree_hop_latency_us
    lat = us_to_s(lat)
    if not tuner:
        # the fill is the node's NVLS pipeline, timed at the collective's link rate
        lat += p.kernel_overhead_s + nvls_fill(nbytes, n // nodes, link_Bps, p, algo)
    return Choice(algo, "Simple", p.nvls_channels, p.threads["Simple"], lat, NVLS_EFFICIENCY)


def estimate(kind: str, algo: str, proto: str, nbytes: float, n: int, nodes: int, link_Bps: float,
             p, net=None, tuner: bool = False) -> Choice:
    """One (algorithm, protocol): its channels, latency and bandwidth factor, as achieved
    or (``tuner``) as NCCL's tuner assumes when it chooses."""
    if algo in ("nvls", "nvls_tree"):
        return _nvls_estimate(algo, nbytes, n, nodes, link_Bps, p, net, tuner)
    nc, nt = (p.channels, p.threads[proto]) if tuner else channels_used(nbytes, proto, n, p)
    bw = bandwidth(kind, algo, proto, nbytes, n, nodes, link_Bps, p, nc, nt, tuner)
    return Choice(algo, proto, nc, nt, latency(kind, algo, proto, n, nodes, p, net, nbytes, tuner), bw / link_Bps)


def bus_bytes(kind: str, algo: str, nbytes: float, n: int, nodes: int = 1) -> float:
    """Bytes the busiest link carries per unit of link fraction (nccl-tests bus factor).
    ``nbytes`` throughout this module is NCCL's: the whole buffer (all-gather: the output,
    n x one rank's part; reduce-scatter: the input)."""
    if algo == "tree":
        return 2.0 * nbytes  # reduce up and broadcast down through each rank's port
    if algo == "nvls":
        return (n + 1) / n * nbytes  # the whole buffer scattered in, plus the slice this rank heads
    if algo == "nvls_tree":  # through a node's NICs each way: the buffer (two nodes), twice past two
        return nbytes if nodes <= 2 else 2.0 * nbytes
    return schedules.bus_factor(kind, n) * nbytes


def predicted_time(c: Choice, kind: str, nbytes: float, n: int, busbw_Bps: float, nodes: int = 1) -> float:
    """The tuner's time: latency + bus bytes / (link bus bandwidth x factor)."""
    return c.latency + bus_bytes(kind, c.algorithm, nbytes, n, nodes) / (busbw_Bps * c.bw_factor)


def choose(kind: str, nbytes: float, n: int, nodes: int, busbw_Bps: float, p, net=None,
           algorithm: str = "auto") -> Choice:
    """The (algorithm, protocol) NCCL's tuner picks (smallest time by its own table;
    ``algorithm`` 'ring' or 'tree' restricts it), with what that choice achieves."""
    algos = candidates(kind, nodes, p, net)
    if algorithm in algos:
        algos = (algorithm,)
    pairs = [(a, proto) for a in algos for proto in protocols(a, net)]
    a, proto = min(pairs, key=lambda ap: predicted_time(
        estimate(kind, *ap, nbytes, n, nodes, busbw_Bps, p, net, tuner=True), kind, nbytes, n, busbw_Bps, nodes))
    return estimate(kind, a, proto, nbytes, n, nodes, busbw_Bps, p, net)


def p2p(per_peer_bytes: float, p, net=None, link_Bps: float = 0.0) -> Choice:
    """NCCL's point-to-point path (send/recv; all-to-all is one pair per peer, grouped):
    LL up to ``p2p_ll_threshold_bytes`` per peer, Simple above (NCCL_P2P_LL_THRESHOLD);
    one step of latency; LL carries 8 data bytes per 16-byte line. Not yet checked
    against a published sendrecv_perf / alltoall_perf curve."""
    proto = "LL" if per_peer_bytes <= p.p2p_ll_threshold_bytes else "Simple"
    hop = net.ring_hop_latency_us[proto] if net is not None else p.ring_hop_latency_us[proto]
    lat = us_to_s(p.kernel_overhead_us + p.base_latency_us[proto] + hop)
    frac = 0.5 if proto == "LL" else 1.0
    if link_Bps > 0:
        frac = min(frac, GBps_to_Bps(p.channels * p.channel_GBps[proto]) / link_Bps)
    return Choice("p2p", proto, p.channels, p.threads[proto], lat, frac)


def host_floor(launch: str, local_gpus: int, call_overhead_s: float, launch_s: float) -> float:
    """Host time per collective in steady state: one call (one process per GPU) or one
    kernel launch per GPU in turn (one process driving ``local_gpus`` GPUs)."""
    if launch == "single-process":
        return local_gpus * launch_s
    return call_overhead_s
