"""NVLS (NVLink SHARP) all-reduce on NVSwitch-3 fabrics: golden values by hand, where NCCL runs
it, its bandwidth bound, and the published H100 curve.

Constants are those of oresearcher/hardware/profiles/nvswitch-h100.yaml: port 450 GB/s x 0.824 = 370.8 GB/s,
16 NVLS channels, tuner latency 25 us, kernel overhead 7.7 us; NCCL's 5/6 NVLS derating and its
chunk ladder live in oresearcher/comm/nccl.py.
"""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from oresearcher import ops as O
from oresearcher.errors import UserError
from oresearcher import comm as C
from oresearcher.comm import nccl as N
from oresearcher.sim.bench import bus_factor, collective_bench, read_reference, reference_check
from oresearcher.sim.engine import Engine
from oresearcher.hardware import builtin_profiles
from oresearcher.comm import build_topology

from simkit import DEVICE, meta

DATA = Path(__file__).resolve().parents[1] / "data"
H100_CURVE = "azure-ndh100v5-h100sxm80-8gpu-nvls"
CAT = builtin_profiles()
H100 = CAT["fabric", "nvswitch-h100"]
PORT = 450e9 * 0.824
US = 1e-6


def h100(n=8, nodes=1, nics=None, inter="ndr-ib"):
    return build_topology(n * nodes, n, H100, CAT["fabric", inter] if nodes > 1 else None, nics or n)


def test_one_gib_golden():
    """1 GiB on 8 H100s: NVLS. 128 slices (16 channels x 8 heads); 2^30 is not below 64 x 128 x
    128 KiB = 2^30, so the chunk stays 128 KiB. Each port carries 9/8 of the buffer at 5/6 of
    370.8 GB/s = 309.0 GB/s: data 9/8 x 2^30 / 309.0e9 = 3909.0 us; the pipeline fills with one
    chunk per slice, 128 x 128 KiB x 9/8 / 309.0e9 = 61.1 us; latency 7.7 + 25 us. In all 4002.8 us."""
    S, t = 2**30, h100()
    pl = C.plan("AllReduce", tuple(range(8)), S, t)
    assert pl.label == "nvls/Simple"
    rate = PORT * 5 / 6
    expect = (7.7 + 25.0) * US + 128 * 131072 * 9 / 8 / rate + 9 / 8 * S / rate
    assert C.plan_time(pl, t) == pytest.approx(expect, rel=1e-9)
    assert expect == pytest.approx(4002.8 * US, rel=1e-4)


@pytest.mark.parametrize("nbytes,chunk", [
    (2**20, 16384), (8 * 2**20 - 1, 16384), (8 * 2**20, 32768), (64 * 2**20 - 1, 32768),
    (64 * 2**20, 65536), (2**30 - 1, 65536), (2**30, 131072), (2**33, 131072)])
def test_chunk_ladder_by_hand(nbytes, chunk):
    """enqueue.cc with 128 slices: 64 KiB below 64 x 128 x 128 KiB = 1 GiB, 32 KiB below
    8 x 128 x 64 KiB = 64 MiB, 16 KiB below 2 x 128 x 32 KiB = 8 MiB."""
    assert N.nvls_chunk(nbytes, 128) == chunk


def test_nvls_only_where_the_switch_reduces():
    """NVLS inside one node, NVLS-tree across nodes whose network states its step latency;
    never on A100's NVSwitch; ring and tree when asked; all-gather stays on the ring."""
    a100 = build_topology(8, 8, CAT["fabric", "nvswitch-a100"])
    for S in (2**20, 2**26, 2**33):
        assert not C.plan("AllReduce", tuple(range(8)), S, a100).label.startswith("nvls")
        assert C.plan("AllReduce", tuple(range(8)), S, h100()).label == "nvls/Simple"
        assert C.plan("AllReduce", tuple(range(8)), S, h100(), "ring").label.startswith("ring/")
        assert C.plan("AllGather", tuple(range(8)), S / 8, h100()).label.startswith("ring/")
        assert not C.plan("AllReduce", tuple(range(16)), S, h100(nodes=2, inter="hdr-ib")).label.startswith("nvls")
    assert C.plan("AllReduce", tuple(range(16)), 2**31, h100(nodes=2)).label == "nvls_tree/Simple"
    assert C.plan("AllReduce", tuple(range(8)), 1024, h100()).label == "ring/LL"  # latency wins small


def test_nvls_tree_two_nodes_golden():
    """2 GiB on 2 x 8 H100 with 8 NDR NICs a node (50 GB/s x 0.9 = 45 GB/s each way): NVLS-tree.
    Latency 25 + 2 x log2(2) x 14 (the network's NVLS-tree step) + 7.7 us = 60.7 us. 128 slices;
    the chunk starts at Simple's 2 MiB and, 2^31 being below 32 x 128 x 2 MiB, drops to 256 KiB:
    the fill is 128 x 256 KiB x 9/8 at 5/6 of the 360 GB/s the NICs allow = 125.8 us. Inside a
    node every port carries 9/8 of the buffer at 5/6 of 370.8 GB/s: 7,818.5 us. Across nodes
    each head's NIC carries its slice (S/8) each way, half on each tree: S/8 at 5/6 of 45 GB/s =
    7,158.3 us, under NVLink's. In all 8,005.0 us: 503 GB/s bus bandwidth over 16 ranks."""
    t, S = h100(nodes=2), 2**31
    pl = C.plan("AllReduce", tuple(range(16)), S, t)
    assert pl.label == "nvls_tree/Simple"
    expect = 60.7 * US + 128 * 262144 * 9 / 8 / (360e9 * 5 / 6) + 9 / 8 * S / (PORT * 5 / 6)
    assert C.plan_time(pl, t) == pytest.approx(expect, rel=1e-9)
    assert expect == pytest.approx(8005.0 * US, rel=1e-4)


def test_nvls_tree_heads_follow_the_nics():
    """One head per NIC: with 4 NICs a node's slices cross four NICs, each carrying S/4 each
    way on two nodes, so from 256 MiB the NICs bind at 4 x 45 x 5/6 = 150 GB/s."""
    t, S = h100(nodes=2, nics=4), 2**30
    pl = C.plan("AllReduce", tuple(range(16)), S, t)
    assert pl.label == "nvls_tree/Simple"
    assert C.plan_time(pl, t) >= S / 150e9
    assert C.plan_time(pl, t) == pytest.approx(S / 150e9, rel=0.05)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 2**34), st.integers(2, 8))
def test_nvls_bus_bandwidth_bound(nbytes, n):
    """What the docs promise: an NVLS all-reduce's nccl-tests bus bandwidth never exceeds
    2(n-1)/(n+1) x 5/6 of the port (480.6 GB/s on 8 H100s), and it is never faster than its
    own data term alone."""
    t = h100(n)
    c = N.estimate("AllReduce", "nvls", "Simple", nbytes, n, 1, PORT, H100.nccl)
    pl = C.plan("AllReduce", tuple(range(n)), nbytes, t, "auto")
    if pl.label != "nvls/Simple":
        return
    secs = C.plan_time(pl, t)
    assert secs >= (n + 1) / n * nbytes / (PORT * 5 / 6) + c.latency * (1 - 1e-12)
    assert 2 * (n - 1) / n * nbytes / secs <= 2 * (n - 1) / (n + 1) * 5 / 6 * PORT * (1 + 1e-9)


def _one(S):
    yield O.AllReduce(meta(S))
    yield O.StepDone(0)


def test_engine_follows_the_closed_form_nvls_plan():
    t = h100()
    for S in (1 << 20, 1 << 26):
        tl = Engine(t, DEVICE, "fp32", "auto").run([_one(S) for _ in range(8)])
        assert max(tl.step_ends[r][-1] for r in range(8)) == pytest.approx(
            C.plan_time(C.plan("AllReduce", tuple(range(8)), S, t), t), rel=1e-9)


def test_h100_curve_within_ten_percent_and_its_plateau():
    rows, ref, err = reference_check(H100_CURVE, DATA / f"nccl-{H100_CURVE}.csv")
    print(f"\n{H100_CURVE}: exp(mean |ln(sim/measured)|) - 1 from 1 MiB = {err:.1%}")
    for r, (s, t) in zip(rows, ref):
        print(f"  {s:>11} B  sim {r['time_us']:9.1f} us  published {t:9.1f} us  {r['algorithm']}")
    assert err <= 0.10
    assert rows[-1]["size_bytes"] == 8 * 2**30 and abs(rows[-1]["busbw_GBps"] / 478.87 - 1) <= 0.03


def test_busbw_only_curve_needs_its_bus_factor(tmp_path):
    path = DATA / f"nccl-{H100_CURVE}.csv"
    with pytest.raises(UserError, match="busbw only"):
        read_reference(path)
    rows = dict(read_reference(path, bus_factor("all_reduce", 8)))
    assert rows[2**20] == pytest.approx(2**20 * 1.75 / 43.7e3)  # 42.0 us
    bad = tmp_path / "bad.csv"
    bad.write_text("size_bytes,time_us,algbw_GBps,busbw_GBps\n1024,,,0\n")
    with pytest.raises(UserError, match="bad row"):
        read_reference(bad, 1.75)


@pytest.mark.parametrize("op,quoted", [("reduce_scatter", 360.0), ("all_gather", 350.0)])
def test_reduce_scatter_and_all_gather_against_nvidias_quoted_busbw(op, quoted):
    """NVIDIA quotes about 360 GB/s reduce-scatter and 350 GB/s all-gather bus bandwidth on
    8 H100s (figures, no curve shipped). Both run NCCL's ring here; at 8 GiB the port's
    370.8 GB/s binds (16 channels x 24 GB/s would allow 384): within 10% of each."""
    t = h100()
    row = collective_bench(t, DEVICE, op, [8 * 2**30])[0]
    print(f"\n{op} 8 GiB on 8 H100: busbw {row['busbw_GBps']:.1f} GB/s, quoted ~{quoted:.0f} "
          f"({row['busbw_GBps'] / quoted - 1:+.1%}), {row['algorithm']}")
    assert row["algorithm"] == "ring/Simple"
    assert abs(row["busbw_GBps"] / quoted - 1) <= 0.10


@settings(max_examples=60, deadline=None)
@given(st.integers(2**20, 2**34), st.sampled_from([2, 4, 8]))
def test_nvls_tree_never_beats_its_links(nbytes, nics):
    """What the docs promise for two nodes: NVLS-tree is never faster than its NVLink part,
    9/8 of the buffer through each port, nor its network part, S / NICs each way through each
    NIC, both at 5/6 of the link."""
    t = h100(nodes=2, nics=nics)
    pl = C.plan("AllReduce", tuple(range(16)), nbytes, t)
    if pl.label != "nvls_tree/Simple":
        return
    floor = max(9 / 8 * nbytes / (PORT * 5 / 6), nbytes / nics / (45e9 * 5 / 6))
    assert C.plan_time(pl, t) >= floor * (1 - 1e-9)
