"""The node's PCIe layout: path types, GPUDirect RDMA and LL128 as NCCL gates them, and
traffic through host memory sharing the PCIe uplinks (worked by hand on the shipped layouts)."""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from oresearcher import comm as C
from oresearcher.comm import build_topology, pcie
from oresearcher.comm import nccl as N
from oresearcher.errors import UserError
from oresearcher.hardware import builtin_profiles
from oresearcher.hardware.node import NodeLayout
from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import build_cluster

ROOT = Path(__file__).resolve().parents[2]
CAT = builtin_profiles()
DGX, P4D, H100 = CAT["node", "dgx-a100"], CAT["node", "hgx-a100-4nic"], CAT["node", "dgx-h100"]
# A made-up node whose four NICs sit on the CPUs' root ports, beside the GPUs' switches.
ROOT_NICS = NodeLayout(name="root-nics", source="made up for the tests: NICs on CPU root ports", gpus=8, nics=4,
                       switches=[{"cpu": c, "gpus": g, "uplink_GBps": 31.5} for c, g in
                                 ((0, [0, 1]), (0, [2, 3]), (1, [4, 5]), (1, [6, 7]))]
                       + [{"cpu": c, "nics": [k], "uplink_GBps": 31.5} for c, k in ((0, 0), (0, 1), (1, 2), (1, 3))])


def two_nodes(layout, level="PXB", nics=None):
    nics = nics or layout.nics
    return build_topology(16, 8, CAT["fabric", "nvswitch-a100"], CAT["fabric", "hdr-ib"], nics,
                          node_pcie=(layout, level))


def test_path_types_of_the_shipped_layouts():
    # DGX A100: GPU 0 and NICs 0-1 share a complex through two switch levels (PXB); NIC 2 is
    # under the other complex of socket 0 (through the host bridge), NIC 4 on socket 1.
    assert [pcie.path_type(DGX, 0, k) for k in (0, 1, 2, 4)] == ["PXB", "PXB", "PHB", "SYS"]
    assert [pcie.nic_of(DGX, g) for g in range(8)] == list(range(8))
    # p4d-style 4-NIC node: two GPUs and one NIC per switch
    assert [pcie.nic_of(P4D, g) for g in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert pcie.path_type(P4D, 1, 0) == "PIX" and pcie.path_type(P4D, 1, 2) == "SYS"
    assert pcie.path_type(H100, 5, 5) == "PIX"
    # NICs on root ports: the nearest is the one on the GPU's socket, through the host bridge
    assert [pcie.nic_of(ROOT_NICS, g) for g in (0, 3, 4, 7)] == [0, 0, 2, 2]
    assert pcie.path_type(ROOT_NICS, 0, 0) == "PHB"


@pytest.mark.parametrize("layout, level, expect", [
    (DGX, "PXB", True), (DGX, "PIX", False), (DGX, "LOC", False), (P4D, "PIX", True), (P4D, "LOC", False),
    (ROOT_NICS, "PXB", False), (ROOT_NICS, "PHB", True)])
def test_gdr_follows_the_gdr_level(layout, level, expect):
    """paths.cc ncclTopoCheckGdr: GDR when the GPU-to-NIC path is no farther than the level."""
    assert pcie.gdr(layout, 0, pcie.nic_of(layout, 0), level) is expect


def test_gdr_off_without_nic_support():
    no_peermem = P4D.model_copy(update={"gdr": False})
    assert not pcie.gdr(no_peermem, 0, 0) and pcie.through_host(no_peermem, 0)


def test_routes_cross_the_uplinks_only_through_host_memory():
    on, off = two_nodes(P4D), two_nodes(P4D, "LOC")
    names = lambda t, a, b: [t.names[i] for i in t.route(a, b)]
    assert names(on, 1, 9) == ["n0.nic0.up", "n1.nic0.down"]
    # GPU 1 -> host (up its switch) -> NIC 0 (down the same switch); on node 1 the reverse
    assert names(off, 1, 9) == ["n0.pcie0.up", "n0.pcie0.down", "n0.nic0.up", "n1.nic0.down",
                                "n1.pcie0.up", "n1.pcie0.down"]
    assert names(off, 0, 1) == names(on, 0, 1)  # inside a node: NVLink, whatever the layout


def test_without_gdr_the_uplinks_bind_golden():
    """p4d-style node, GDR off: each switch's 8 GT/s x16 uplink (15.75 GB/s x 256/280 = 14.4 GB/s
    each way) carries what its NIC sends and what it receives, so a NIC moves at most 7.2 GB/s
    each way and a node 4 x 7.2 = 28.8 GB/s, against 4 x 22.5 = 90 GB/s with GDR. At 8 GiB the
    simulated bus bandwidth is within 1% of it (the solver finds the uplink, not the NIC)."""
    from oresearcher.sim.bench import collective_bench

    uplink = 15.75e9 * 256 / 280
    t = two_nodes(P4D, "LOC")
    assert t.bus_bandwidth(tuple(range(16))) == pytest.approx(4 * uplink / 2)
    row = collective_bench(t, CAT["device", "A100-SXM4-80GB"], "all_reduce", [8 * 2**30])[0]
    assert row["busbw_GBps"] == pytest.approx(4 * uplink / 2 / 1e9, rel=0.01)
    on = collective_bench(two_nodes(P4D), CAT["device", "A100-SXM4-80GB"], "all_reduce", [8 * 2**30])[0]
    assert on["busbw_GBps"] == pytest.approx(90.0, rel=0.01)


@settings(max_examples=40, deadline=None)
@given(st.integers(22, 33))
def test_turning_gdr_off_never_speeds_an_all_reduce_up(log_size):
    """From 4 MiB, where the links bind. (Below, the tuner may pick another protocol on the
    slower node, and the model's achieved times need not follow the tuner's order.)"""
    ranks, S = tuple(range(16)), 2.0**log_size
    on, off = two_nodes(P4D), two_nodes(P4D, "LOC")
    assert C.plan_time(C.plan("AllReduce", ranks, S, off), off) >= C.plan_time(C.plan("AllReduce", ranks, S, on), on)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2**33), st.sampled_from(["AllReduce", "AllGather", "ReduceScatter"]))
def test_no_ll128_across_nodes_beyond_pxb(nbytes, kind):
    """tuning.cc: LL128 only where the ring's GPU-to-NIC path is at most PXB. NICs on the root
    ports are PHB from every GPU: never LL128 across such nodes, even with GDR raised to PHB."""
    for level in ("PXB", "PHB"):
        t = two_nodes(ROOT_NICS, level)
        assert not t.ll128_across_nodes(tuple(range(16)))
        assert C.plan(kind, tuple(range(16)), nbytes, t).label.split("/")[1] != "LL128"
    assert two_nodes(P4D, "LOC").ll128_across_nodes(tuple(range(16)))  # GDR off under a switch: still PIX


def test_network_channel_rates_only_lower_a_channel():
    from oresearcher.comm.nccl_tier import _net_channels

    p = CAT["fabric", "nvswitch-a100"].nccl
    net = CAT["fabric", "hdr-ib"].nccl_net.model_copy(update={"channel_GBps": {"LL128": 4.0, "Simple": 99.0}})
    rates = _net_channels(p, net).channel_GBps
    assert rates == {"LL": p.channel_GBps["LL"], "LL128": 4.0, "Simple": p.channel_GBps["Simple"]}
    assert N.protocols("ring", net.model_copy(update={"ll128": False})) == ("LL", "Simple")


def test_a_layout_lists_every_device_once():
    with pytest.raises(ValidationError, match="exactly once"):
        NodeLayout(name="x", source="a made-up document", gpus=2, nics=1,
                   switches=[{"cpu": 0, "gpus": [0, 0], "nics": [0], "uplink_GBps": 1.0}])


def _scenario(**cluster):
    return load_scenario(ROOT / "scenarios" / "2x8xA100-4nic.yaml", [f"cluster.{k}={v}" for k, v in cluster.items()])


def test_the_scenario_names_its_layout_and_refuses_a_wrong_one():
    sc = _scenario()
    assert sc.cluster.node_layout == "hgx-a100-4nic" and sc.cluster.gdr_level == "PXB"
    _, t = build_cluster(sc)
    assert t.layout.name == "hgx-a100-4nic" and t.nic_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(UserError, match="8 NICs"):
        build_cluster(_scenario(node_layout="dgx-a100"))
    with pytest.raises(UserError, match="cluster.node_layout.*known: dgx-a100"):
        _scenario(node_layout="dgx-z100")
    with pytest.raises(UserError, match="gdr_level"):
        _scenario(gdr_level="NVL")
