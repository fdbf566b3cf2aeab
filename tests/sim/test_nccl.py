"""NCCL's protocol model: golden values derived by hand, its bounds, and the published curves.

Constants below are those of oresearcher/hardware/profiles/nvswitch-a100.yaml (NCCL 2.8's tuning.cc plus the
measured ones named there); a test that reads them from the profile says so.
"""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from oresearcher import ops as O
from oresearcher import comm as C
from oresearcher.comm import nccl as N
from oresearcher.sim.bench import REFERENCES, reference_check
from oresearcher.sim.engine import Engine
from oresearcher.hardware import builtin_profiles
from oresearcher.comm import build_topology

from simkit import DEVICE, meta

DATA = Path(__file__).resolve().parents[1] / "data"
CAT = builtin_profiles()
NVS = CAT["fabric", "nvswitch-a100"]
P = NVS.nccl
US = 1e-6


def a100(n=8, launch="per-process", nodes=1, inter=None, nics=1):
    return build_topology(n * nodes, n, NVS, CAT["fabric", inter] if inter else None, nics, launch)


def test_eight_bytes_golden():
    """8 B all-reduce on 8 GPUs, one process per GPU. The tuner picks ring/LL (3.6 + 14 x 0.47
    = 10.18 us beats every other pair). 8 B < nc x nt x (8 x 8): channels drop to 1, then
    threads halve 512 -> 256 -> 128 -> 64 (64 is not a multiple of 128). Time = kernel 6.8 +
    10.18 us + bus bytes 2 x 7/8 x 8 = 14 B at min(235/4 GB/s, 1 channel x 2.45 GB/s x 64/256)."""
    pl = C.plan("AllReduce", tuple(range(8)), 8, a100())
    assert pl.label == "ring/LL"
    assert N.channels_used(8, "LL", 8, P) == (1, 64)
    expect = (6.8 + 3.6 + 14 * 0.47) * US + 14 / (2.45e9 * 64 / 256)
    assert C.plan_time(pl, a100()) == pytest.approx(expect, rel=1e-9)


def test_one_gib_golden():
    """1 GiB: ring/Simple on all 12 channels; latency 6.8 + 8.4 + 2 slices x 14 steps x 3.4
    = 110.4 us; bus bandwidth min(port 300 x 0.78333 = 235 GB/s, 12 x 20 GB/s) = 235 GB/s."""
    S = 2**30
    pl = C.plan("AllReduce", tuple(range(8)), S, a100())
    assert pl.label == "ring/Simple"
    expect = 110.4 * US + 2 * 7 / 8 * S / (300e9 * 0.78333)
    assert C.plan_time(pl, a100()) == pytest.approx(expect, rel=1e-9)


def test_one_process_driving_eight_gpus_floors_at_eight_launches():
    """-g 8: the host launches 8 kernels of 4 us in turn, so a tiny all-reduce takes 32 us,
    not the kernel's 17; one process per GPU pays its 3 us call under the kernel."""
    per = C.plan_time(C.plan("AllReduce", tuple(range(8)), 8, a100()), a100())
    single = C.plan_time(C.plan("AllReduce", tuple(range(8)), 8, a100(launch="single-process")),
                         a100(launch="single-process"))
    assert single == pytest.approx(8 * 4.0 * US) and per == pytest.approx(17.0 * US, rel=0.01)


def _one(S):
    yield O.AllReduce(meta(S))
    yield O.StepDone(0)


def test_engine_follows_the_closed_form_plan():
    t = a100()
    for S in (8, 1 << 16, 1 << 20, 1 << 26):
        eng = Engine(t, DEVICE, "fp32", "auto")
        tl = eng.run([_one(S) for _ in range(8)])
        assert max(tl.step_ends[r][-1] for r in range(8)) == pytest.approx(
            C.plan_time(C.plan("AllReduce", tuple(range(8)), S, t), t), rel=1e-9)


def test_concurrent_collectives_still_share_links():
    t, S = a100(), 256 << 20

    def prog(k):
        hs = []
        for _ in range(k):
            hs.append((yield O.AllReduce(meta(S), async_op=True)))
        for h in hs:
            yield O.Wait(h)
        yield O.StepDone(0)
    times = []
    for k in (1, 2):
        tl = Engine(t, DEVICE, "fp32", "auto").run([prog(k) for _ in range(8)])
        times.append(max(tl.step_ends[r][-1] for r in range(8)))
    bw_part = times[0] - 110.4 * US
    assert times[1] == pytest.approx(110.4 * US + 2 * bw_part, rel=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2**34), st.sampled_from(N.PROTOCOLS), st.integers(2, 64))
def test_channels_follow_the_thread_threshold(nbytes, proto, n):
    nc, nt = N.channels_used(nbytes, proto, n, P)
    thr = P.thread_threshold[proto] * (n if proto == "LL" else 1)
    assert 1 <= nc <= P.channels and 1 <= nt <= P.threads[proto]
    if nc < P.channels:  # dropped only while the message was too small for one more
        assert nbytes < (nc + 1) * P.threads[proto] * thr
    if nbytes >= P.channels * P.threads[proto] * thr:
        assert (nc, nt) == (P.channels, P.threads[proto])


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 2**33), st.sampled_from(["AllReduce", "AllGather", "ReduceScatter", "Broadcast"]),
       st.sampled_from([(8, 1), (8, 2), (4, 4)]))
def test_choice_is_the_tuners_minimum_and_achieves_at_most_the_links(nbytes, kind, shape):
    g, nodes = shape
    t = a100(g, nodes=nodes, inter="hdr-ib" if nodes > 1 else None, nics=g if nodes > 1 else 1)
    ranks = tuple(range(g * nodes))
    net = t.inter.nccl_net if nodes > 1 else None
    c = N.choose(kind, nbytes, len(ranks), nodes, t.bus_bandwidth(ranks), P, net)
    tuner = {(a, p): N.predicted_time(N.estimate(kind, a, p, nbytes, len(ranks), nodes, t.bus_bandwidth(ranks),
                                                 P, net, tuner=True), kind, nbytes, len(ranks), t.bus_bandwidth(ranks))
             for a in N.candidates(kind, nodes) for p in N.PROTOCOLS}
    assert tuner[c.algorithm, c.protocol] == min(tuner.values())
    assert 0 < c.bw_factor <= 1.0
    assert c.latency >= P.kernel_overhead_us * US


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_published_curves_within_ten_percent(name):
    rows, ref, err = reference_check(name, DATA / f"nccl-{name}.csv")
    print(f"\n{name}: exp(mean |ln(sim/measured)|) - 1 = {err:.1%}")
    for r, (s, t) in zip(rows, ref):
        print(f"  {s:>11} B  sim {r['time_us']:9.1f} us  measured {t:9.1f} us  {r['algorithm']}")
    assert err <= 0.10


def test_large_busbw_and_small_latency_targets():
    rows, _, _ = reference_check("oci-spinup-gpu-cluster-a100sxm40-8gpu",
                                 DATA / "nccl-oci-spinup-gpu-cluster-a100sxm40-8gpu.csv")
    assert rows[-1]["size_bytes"] == 8 * 2**30 and abs(rows[-1]["busbw_GBps"] / 235 - 1) <= 0.03
    rows, _, _ = reference_check("abci2-intra-anode-job08-a100sxm40-8gpu",
                                 DATA / "nccl-abci2-intra-anode-job08-a100sxm40-8gpu.csv")
    eight = next(r for r in rows if r["size_bytes"] == 8)
    assert abs(eight["time_us"] / 17.0 - 1) <= 0.20


def test_send_recv_golden():
    """1 MiB send/recv on NVSwitch: above the 16 KiB LL threshold, so Simple; one step of
    latency 6.8 + 8.4 + 3.4 = 18.6 us; the link at min(1, 12 channels x 20 GB/s / 235 GB/s) = 1."""
    t, S = a100(), 2**20
    pl = C.plan("SendRecv", (0, 1), S, t)
    assert pl.label == "p2p/Simple"
    assert C.plan_time(pl, t) == pytest.approx(18.6 * US + S / (300e9 * 0.78333), rel=1e-9)


def test_all_to_all_golden():
    """64 KiB all-to-all on 8 GPUs: 8 KiB per peer <= 16 KiB, so LL: latency 6.8 + 3.6 + 0.47
    us; each port sends 7 x 8 KiB at min(LL's 1/2 of the link, 12 x 2.45 GB/s)."""
    t, S = a100(), 2**16
    pl = C.plan("AllToAll", tuple(range(8)), S, t)
    assert pl.label == "p2p/LL"
    link = 300e9 * 0.78333
    expect = (6.8 + 3.6 + 0.47) * US + 7 * S / 8 / min(0.5 * link, 12 * 2.45e9)
    assert C.plan_time(pl, t) == pytest.approx(expect, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.integers(8, 2**32))
def test_all_gather_and_reduce_scatter_of_one_buffer_cost_the_same(total):
    """NCCL prices both by the whole buffer with (n-1)/n of it on every link: an all-gather
    whose output is ``total`` bytes costs what a reduce-scatter of a ``total``-byte input does."""
    t = a100()
    ag = C.plan_time(C.plan("AllGather", tuple(range(8)), total / 8, t), t)
    rs = C.plan_time(C.plan("ReduceScatter", tuple(range(8)), total, t), t)
    assert ag == pytest.approx(rs, rel=1e-9)


@pytest.mark.parametrize("nbytes, proto, expect", [
    # Simple: one channel of 512 threads wants 512 x 64 B = 32 KiB; 16 MiB >= 12 x 32 KiB keeps all
    (16 * 2**20, "Simple", (12, 512)),
    # 256 KiB < nc x 32 KiB until nc = 8 (8 x 32 KiB = 256 KiB is not below it)
    (256 * 2**10, "Simple", (8, 512)),
    # LL128: 640 x 8 B = 5 KiB a channel; 64 KiB >= 12 x 5 KiB = 60 KiB keeps 12, 32 KiB drops to 6
    (64 * 2**10, "LL128", (12, 640)),
    (32 * 2**10, "LL128", (6, 640)),
    # ring LL on 8 ranks: 8 B x 8 a thread, 32 KiB a channel; 128 KiB -> 4 channels
    (128 * 2**10, "LL", (4, 512)),
])
def test_mid_size_channels_golden(nbytes, proto, expect):
    """Channels and threads NCCL's getAlgoInfo gives a message (enqueue.cc, NCCL 2.8.4; the
    same loop in 2.18.5 and 2.30): drop a channel, then halve the threads, while the
    message is smaller than channels x threads x the protocol's per-thread threshold."""
    assert N.channels_used(nbytes, proto, 8, P) == expect


def test_sixteen_mib_golden():
    """16 MiB all-reduce on 8 A100s: ring/Simple on all 12 channels (above). The kernel
    sends each step's chunk as 2 slices behind 2 flag waits (ALLREDUCE_CHUNKSTEPS 4 /
    SLICESTEPS 2), so the 14 steps cost 2 x 14 x 3.4 us: kernel 6.8 + base 8.4 + 95.2 =
    110.4 us, plus 2 x 7/8 x 16 MiB at 235 GB/s = 124.9 us: 235.3 us (ABCI measured 236.6)."""
    S = 16 * 2**20
    pl = C.plan("AllReduce", tuple(range(8)), S, a100())
    assert pl.label == "ring/Simple" and N.slices_per_chunk("AllReduce", "Simple") == 2
    assert C.plan_time(pl, a100()) == pytest.approx(110.4 * US + 2 * 7 / 8 * S / (300e9 * 0.78333), rel=1e-9)


@pytest.mark.parametrize("name", ["abci2-intra-anode-job08-a100sxm40-8gpu", "oci-spinup-gpu-cluster-a100sxm40-8gpu"])
def test_one_node_a100_mid_sizes_within_ten_percent(name):
    """Where gradient buckets live, 16-32 MiB: every size of the one-node A100 curves within 10%."""
    rows, ref, _ = reference_check(name, DATA / f"nccl-{name}.csv")
    sim = {r["size_bytes"]: r["time_us"] for r in rows}
    mid = [(s, t) for s, t in ref if 16 * 2**20 <= s <= 32 * 2**20]
    assert len(mid) == 2
    for s, t in mid:
        assert abs(sim[s] / t - 1) <= 0.10, (s, sim[s], t)
