"""Collective algorithms: golden numbers derived by hand, properties, fidelity to nccl-tests."""
import pytest
from oresearcher.sim.engine import Engine
from hypothesis import given, settings, strategies as st

from oresearcher import ops as O
from oresearcher import comm as C
from oresearcher.sim.bench import collective_bench
from oresearcher.hardware import builtin_profiles
from oresearcher.comm import build_topology

from simkit import DEVICE, meta, time_one, topo

MiB = 2**20
US = 1e-6


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allreduce_1MiB_golden(n):
    # call 2 us + base 5 us + 2(n-1) hops x 1 us + 2(n-1)/n x 1 MiB / 100 GB/s
    expect = (2 + 5 + 2 * (n - 1)) * US + 2 * (n - 1) / n * MiB / 100e9
    t, tl = time_one(topo(n), lambda r: O.AllReduce(meta(MiB)), "ring")
    assert t == pytest.approx(expect, rel=1e-12)
    assert tl.wire[0] == pytest.approx(2 * (n - 1) / n * MiB)


def test_point_to_point_send_golden():
    # call 2 us + one hop 1 us + 1 MiB / 100 GB/s; no base collective latency
    def op(r):
        return O.Send(meta(MiB), dst=1) if r == 0 else O.Recv(meta(MiB), src=0)
    t, _ = time_one(topo(2), op)
    assert t == pytest.approx(3 * US + MiB / 100e9, rel=1e-12)


def test_two_concurrent_allreduces_on_shared_links_take_twice_the_bandwidth_time():
    t1 = topo(4)
    alone, _ = time_one(t1, lambda r: O.AllReduce(meta(64 * MiB)), "ring")
    fixed = (2 + 5 + 6) * US

    def prog(r):
        h1 = yield O.AllReduce(meta(64 * MiB), async_op=True)
        h2 = yield O.AllReduce(meta(64 * MiB), async_op=True)
        yield O.Wait(h1)
        yield O.Wait(h2)
        yield O.StepDone(0)
    eng = Engine(t1, DEVICE, "fp32", "ring")
    tl = eng.run([prog(r) for r in range(4)])
    both = max(tl.step_ends[r][-1] for r in range(4))
    assert both - fixed == pytest.approx(2 * (alone - fixed), rel=1e-9)


def test_hierarchical_moves_fewer_bytes_across_nodes_than_flat_ring():
    # the alpha-beta tier: NVSwitch without its NCCL model (whose rings are rail-aligned)
    a100 = builtin_profiles()
    t = build_topology(16, 8, a100["fabric", "nvswitch-a100"].model_copy(update={"nccl": None}),
                       a100["fabric", "hdr-ib"], 8)
    ranks = tuple(range(16))
    S = 256 * MiB
    inter = lambda ph: sum(b for p in ph for s, d, b in p.flows if not t.same_node(s, d))
    assert inter(C.phases("AllReduce", "hierarchical", ranks, S, t.node_of)) < inter(C.phases("AllReduce", "ring", ranks, S, t.node_of))
    assert C.closed_form_time("AllReduce", "hierarchical", ranks, S, t) < C.closed_form_time("AllReduce", "ring", ranks, S, t)


KINDS = ["AllReduce", "ReduceScatter", "AllGather", "AllToAll", "Broadcast"]


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(KINDS), st.sampled_from(C.ALGORITHMS), st.integers(2, 9),
       st.integers(1, 2**30), st.integers(1, 2**30))
def test_time_is_monotone_in_message_size(kind, algo, n, a, b):
    t = topo(n)
    small, big = sorted((a, b))
    ranks = tuple(range(n))
    assert C.closed_form_time(kind, algo, ranks, small, t) <= C.closed_form_time(kind, algo, ranks, big, t)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(KINDS), st.sampled_from(C.ALGORITHMS), st.integers(2, 9),
       st.integers(1, 2**28), st.floats(0.0, 10.0), st.floats(0.0, 10.0))
def test_time_is_monotone_in_hop_latency(kind, algo, n, size, h1, h2):
    lo, hi = sorted((h1, h2))
    ranks = tuple(range(n))
    assert (C.closed_form_time(kind, algo, ranks, size, topo(n, hop_latency_us=lo))
            <= C.closed_form_time(kind, algo, ranks, size, topo(n, hop_latency_us=hi)))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(2, 8), st.integers(1, 2**26))
def test_ring_time_is_monotone_in_hop_count(n1, n2, size):
    lo, hi = sorted((n1, n2))
    # more ranks on the ring: more sequential hops for the same payload
    assert (C.closed_form_time("AllReduce", "ring", tuple(range(lo)), size, topo(lo))
            <= C.closed_form_time("AllReduce", "ring", tuple(range(hi)), size, topo(hi)))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["ring", "tree", "direct", "halving_doubling", "auto"]), st.integers(2, 8),
       st.integers(10, 33))
def test_busbw_never_exceeds_bottleneck_link(algo, n, log_size):
    t = topo(n)
    rows = collective_bench(t, DEVICE, "all_reduce", sizes=[2**log_size], algorithm=algo)
    assert rows[0]["busbw_GBps"] <= 100.0 * (1 + 1e-9)


def test_wire_bytes_per_rank_matches_textbook_ring():
    S, n = 8 * MiB, 8
    assert C.wire_bytes_per_rank("AllReduce", "ring", S, n) == pytest.approx(2 * (n - 1) / n * S)
    assert C.wire_bytes_per_rank("AllGather", "ring", S, n) == pytest.approx((n - 1) * S)
    assert C.wire_bytes_per_rank("ReduceScatter", "ring", S, n) == pytest.approx((n - 1) / n * S)


def _a100():
    p = builtin_profiles()
    return build_topology(8, 8, p["fabric", "nvswitch-a100"]), p["device", "A100-SXM4-80GB"]


def test_fidelity_8xA100_large_allreduce_busbw_matches_nccl_tests():
    t, dev = _a100()
    for row in collective_bench(t, dev, "all_reduce", sizes=[256 * MiB, 1024 * MiB, 8 * 1024 * MiB]):
        assert 190.0 <= row["busbw_GBps"] <= 240.0, row


def test_fidelity_8xA100_tiny_allreduce_costs_tens_of_microseconds():
    t, dev = _a100()
    row = collective_bench(t, dev, "all_reduce", sizes=[8])[0]
    assert 10.0 <= row["time_us"] <= 100.0, row


def test_forced_algorithm_that_does_not_apply_falls_back_to_ring():
    assert C.choose_algorithm("ReduceScatter", (0, 1, 2), 1000, topo(3), "tree") == "ring"
    ph = C.phases("AllReduce", "halving_doubling", (0, 1, 2), 300.0, [0, 0, 0])
    assert ph == C.phases("AllReduce", "ring", (0, 1, 2), 300.0, [0, 0, 0])
