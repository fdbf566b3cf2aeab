"""GPU-to-NIC affinity across nodes: which GPUs share a NIC, the channels NCCL runs across
nodes, and a two-node node with 4 NICs per 8 GPUs against a derivation by hand."""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from oresearcher.scenario import load_scenario
from oresearcher import comm as C
from oresearcher.hardware import builtin_profiles
from oresearcher.sim.simulate import build_cluster
from oresearcher.comm import build_topology

ROOT = Path(__file__).resolve().parents[2]
CAT = builtin_profiles()
US = 1e-6


def a100(nics, nodes=2, g=8):
    return build_topology(nodes * g, g, CAT["fabric", "nvswitch-a100"], CAT["fabric", "hdr-ib"], nics)


def test_four_nic_scenario_against_a_derivation_by_hand():
    """scenarios/2x8xA100-4nic.yaml: 2 nodes x 8 A100 (NVLink 300 GB/s x 0.78333 = 235 GB/s per
    GPU), 4 HDR NICs per node (200 Gb/s = 25 GB/s x 0.9 = 22.5 GB/s each way), GPUs 0-1 with
    NIC 0 on one PCIe switch, 2-3 with NIC 1, and so on.

    Channels: NCCL's network search gives one ring per NIC and duplicates them: 8 channels,
    two per NIC. A ring all-reduce over 16 ranks sends 2 x 15/16 x S per rank; every channel
    crosses each node boundary once each way, so a NIC carries two channels' share,
    2 x (2 x 15/16 x S / 8) = 15/32 x S, each way.

    1 GiB (Simple, the whole link): NICs 15/32 x 2^30 / 22.5e9 = 22,369.9 us; NVLink
    2 x 15/16 x 2^30 / 235e9 = 8,567.6 us does not bind. Latency: 8.4 + 2 slices x (28 NVLink
    steps x 3.4 + 2 network steps x 9.6) = 237.2 us, x 1.9 past the ring's plateau = 450.7 us,
    plus the kernel's 6.8 us. In all 22,827.4 us: 88.2 GB/s bus bandwidth, half the 8-NIC node's.

    25 MB (one gradient bucket; LL128): a channel's thread block copies 8.35 GB/s of LL128, so
    8 channels give 66.8 GB/s, below the NICs' 90 GB/s x 120/128 (LL128's payload share):
    2 x 15/16 x 25e6 / 66.8e9 = 701.7 us. Latency 10.0 + 28 x 1.9 + 2 x 4.0 = 71.2 us, plus
    6.8 us: 779.7 us. On 8 NICs the same bucket gets 12 channels (100.2 GB/s): 545.8 us."""
    _, topo = build_cluster(load_scenario(str(ROOT / "scenarios" / "2x8xA100-4nic.yaml"), []))
    ranks = tuple(range(16))
    assert topo.nic_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.net_channels(ranks, 12) == 8
    by_hand = {2**30: 22827.4, 25e6: 779.7}
    for S, expect_us in by_hand.items():
        got = C.plan_time(C.plan("AllReduce", ranks, S, topo), topo) / US
        print(f"\n{S:>12.0f} B: simulated {got:9.1f} us, by hand {expect_us:9.1f} us ({got / expect_us - 1:+.1%})")
        assert abs(got / expect_us - 1) <= 0.15
    eight = a100(8)
    assert C.plan_time(C.plan("AllReduce", ranks, 25e6, eight), eight) / US == pytest.approx(545.8, rel=1e-3)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([2, 4, 8]))
def test_nic_groups_partition_the_gpus_and_channels_follow_the_nics(nics, g):
    t = a100(nics, g=g)
    groups = t.nic_groups()
    assert sorted(i for grp in groups for i in grp) == list(range(g))
    assert len(groups) == min(nics, g)
    ranks = tuple(range(2 * g))
    assert t.net_channels(ranks, 12) == min(12, 2 * len(groups))


@settings(max_examples=40, deadline=None)
@given(st.integers(28, 33))
def test_fewer_nics_never_speed_up_a_bandwidth_bound_all_reduce(log_size):
    """From 256 MiB up the NICs bind, so a node with fewer NICs is never faster."""
    S, ranks = 2.0**log_size, tuple(range(16))
    times = {n: C.plan_time(C.plan("AllReduce", ranks, S, a100(n)), a100(n)) for n in (2, 4, 8)}
    assert times[2] >= times[4] >= times[8]
