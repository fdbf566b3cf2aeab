"""FSDP2's host costs in the fsdp schedule (oresearcher/programs/fsdp_costs.py), against
numbers derived by hand, and the calibration that measures them.

Golden setting (tests/sim/test_fsdp.py): two blocks of BLOCK = 2e7 fp32 elements (80 MB),
10 ms forward / 20 ms backward each at 1 TFLOP/s, a root with nothing; 2 ranks; the
golden fabric moves (n-1)/n x 80 MB in 400 us + 8 us per collective. Golden costs:
copies at 100 GB/s (read + write bytes), 10 us per parameter of DTensor dispatch.
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher import ops as O
from oresearcher.calibration.profiles import device_doc, pass_rate
from oresearcher.programs.fsdp import Schedule
from oresearcher.programs.fsdp_costs import HostCosts, gather_copy_bytes, reduce_copy_bytes
from oresearcher.models.sharding import ShardPlan, Unit, shard_groups
from oresearcher.sim.engine import Engine
from oresearcher.hardware import DeviceProfile
from simkit import DEVICE, topo

BLOCK = 2 * 10**7
CF, CB = 10e9, 20e9


def two_blocks():
    block = Unit("block", ((BLOCK,),), CF, CB)
    return ShardPlan(Unit("root", (), 0.0, 0.0), (block, block))


def step_time(costs, streams, plan=None, world=2, reshard=True):
    def prog(rank):
        shard, rep = shard_groups(rank, world, world)
        sched = Schedule(plan or two_blocks(), shard, rep, reshard, torch.float32, torch.float32, streams, costs)
        yield from sched.step()
        yield from sched.optimizer_dispatch()
        yield O.StepDone(0)
    tl = Engine(topo(world), DEVICE, "fp32", "ring").run([prog(r) for r in range(world)])
    return tl.step_ends[0][0]


def golden(streams, **kw):
    return HostCosts(rate=1e12, bandwidth=100e9, dtensor_param_s=10e-6, streams=streams, **kw)


def test_copy_bytes_by_hand():
    # 1000 elements on 4 ranks, fp32 throughout: copy-in reads and writes the 250-element
    # shard (2000 B), copy-out the 1000 gathered (8000 B)
    assert gather_copy_bytes(1000, 4, 4) == (2000, 8000)
    assert gather_copy_bytes(1000, 4, 2) == (250 * 6, 4000)  # bf16: read fp32, write bf16
    # chunk_cat 8000 B; the guard reads twice and rewrites (4 x 4000 B); the shard is
    # accumulated (read 2, write 1) and checked (read 2): 5 x 1000 B
    assert reduce_copy_bytes(1000, 4, 4, 4) == (8000, 16000, 5000)
    # bf16 gradients reduced in bf16: chunk_cat 4000; guard 8000; the shard cast to fp32
    # (250 x 6) before the 5 fp32 passes
    assert reduce_copy_bytes(1000, 4, 2, 2) == (4000, 8000, 1500 + 5000)


def test_cpu_rank_pays_every_copy_by_hand():
    # without streams: 62.056 ms of collectives and compute (test_fsdp.py). Each of the 3
    # block gathers copies in 80 MB (0.8 ms) and out 160 MB (1.6 ms); each of the 2 block
    # reduce-scatters copies in 160 MB (1.6 ms), guards 320 MB (3.2 ms), accumulates and
    # checks 200 MB (2 ms); the optimizer dispatches 2 parameters x 10 us.
    want = 62.056e-3 + 3 * 2.4e-3 + 2 * 6.8e-3 + 20e-6
    assert step_time(golden(False), streams=False) == pytest.approx(want, rel=1e-9)


def test_gpu_pays_only_the_copies_on_its_compute_stream_by_hand():
    # with streams: 60.816 ms (test_fsdp.py) plus the copy-outs of 3 block gathers and the
    # chunk_cats of 2 block reduce-scatters, 1.6 ms each, on the compute stream; copy-in,
    # guard and accumulation run on the collectives' streams, hidden
    want = 60.816e-3 + 5 * 1.6e-3 + 20e-6
    assert step_time(golden(True), streams=True) == pytest.approx(want, rel=1e-9)


def test_bookkeeping_per_parameter_by_hand():
    # 1 parameter per block, none in the root: 3 block gathers x 1 ms and 2 block
    # reduce-scatters x 2 ms of FSDP2's Python on a CPU rank; none on a GPU (host runs ahead)
    costs = HostCosts(rate=1e12, streams=False, gather_param_s=1e-3, reduce_param_s=2e-3)
    assert step_time(costs, streams=False) == pytest.approx(62.056e-3 + 3e-3 + 4e-3, rel=1e-9)
    gpu = HostCosts(rate=1e12, streams=True, gather_param_s=1e-3, reduce_param_s=2e-3, unit_step_s=1e-3)
    assert step_time(gpu, streams=True) == pytest.approx(60.816e-3, rel=1e-9)
    # the hooks: 1 ms for each of the 3 units (root and 2 blocks) in a step
    hooks = HostCosts(rate=1e12, streams=False, unit_step_s=1e-3)
    assert step_time(hooks, streams=False) == pytest.approx(62.056e-3 + 3e-3, rel=1e-9)


def test_passes_at_the_pass_rate_by_hand():
    # forward and backward at half the engine's rate take twice as long: 120 ms of passes
    # + 2.056 ms of blocking collectives; nothing else is priced
    costs = HostCosts(rate=1e12, pass_rate=0.5e12, streams=False)
    assert step_time(costs, streams=False) == pytest.approx(120e-3 + 2.056e-3, rel=1e-9)
    assert step_time(None, streams=False) == pytest.approx(62.056e-3, rel=1e-9)  # no costs: as before
    # at the pass rate the device's rate no longer holds the optimizer: the step's work on
    # the rank's 2 x 1e7 elements at 1 ns each (20 ms) is charged, with the dispatch
    costs = HostCosts(rate=1e12, pass_rate=1e12, streams=False, element_s=1e-9, dtensor_param_s=10e-6)
    assert step_time(costs, streams=False) == pytest.approx(62.056e-3 + 20e-3 + 20e-6, rel=1e-9)
    assert HostCosts(rate=1e12, element_s=1e-9).optimizer_s(2, 2e7) == 0.0  # folded in the rate


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=3), st.sampled_from([1, 2, 4]), st.booleans(),
       st.booleans(), st.floats(1e8, 1e12), st.floats(0, 1e-3))
def test_costs_only_add_time(sizes, world, streams, reshard, bw, dispatch):
    # the documented bound: FSDP2's copies and dispatch never make a step faster, and a
    # profile that measured neither leaves the schedule as it was
    block = Unit("block", tuple((s,) for s in sizes), 1e6, 2e6)
    plan = ShardPlan(Unit("root", ((7,),), 1e5, 1e5), (block, block))
    base = step_time(None, streams, plan, world, reshard)
    costed = step_time(HostCosts(1e12, bw, dispatch, streams), streams, plan, world, reshard)
    assert costed >= base * (1 - 1e-12)
    assert step_time(HostCosts(1e12, None, 0.0, streams), streams, plan, world, reshard) == pytest.approx(base)


def test_costs_from_a_device_profile():
    dev = DeviceProfile(name="d", peak_flops={"fp32": 1e12, "bf16": 2e12}, efficiency=0.5, memory_bytes=1e9,
                        host_overhead_us=0.0, memory_bandwidth_GBps=10.0, memory_efficiency=0.5,
                        dtensor_param_step_us=30.0, pass_flops_per_s=4e11, streams=False, optimizer_element_ns=3.0,
                        fsdp_gather_param_us=25.0, fsdp_reduce_param_us=20.0, fsdp_unit_step_us=600.0)
    c = HostCosts.of(dev, "bf16")
    assert (c.element_s, c.gather_param_s, c.reduce_param_s, c.hooks_s()) == pytest.approx((3e-9, 25e-6, 20e-6, 6e-4))
    assert (c.rate, c.bandwidth, c.dtensor_param_s, c.streams, c.pass_rate) == (1e12, 5e9, pytest.approx(30e-6),
                                                                               False, 4e11)
    assert c.flops(2e-3) == 2e9 and c.passes(4e11) == pytest.approx(1e12)  # 1 s at the pass rate
    assert HostCosts.of(DEVICE, "fp32").bandwidth is None  # no memory bandwidth: copies unpriced


def test_calibration_writes_what_it_measured_by_hand():
    # 1e9 FLOP per step in passes of 10 and 20 ms on two ranks, 2 pass ops x 1 ms of host
    m = {"backend": "gloo", "host_overhead_s": 1e-3, "compute_step_s": 0.03, "flops_per_step": 1e9,
         "compute_step_s_mean": 0.025, "pass_step_s_per_rank": [0.01, 0.02], "pass_ops_per_step": 2,
         "copy_Bps": 4e9, "dtensor_param_step_s": 1.5e-4, "optimizer_element_s": 2e-9,
         "gather_param_s": 2.5e-5, "reduce_param_s": 2e-5, "unit_step_s": 6e-4}
    assert pass_rate(m) == pytest.approx(1e9 / 0.018)  # the slowest rank, host off
    assert pass_rate(m, jitter=True) == pytest.approx(1e9 / 0.013)  # the mean rank
    doc = device_doc("d", m, 1e9)
    assert doc["pass_flops_per_s"] == pytest.approx(1e9 / 0.018)
    assert doc["memory_bandwidth_GBps"] == pytest.approx(4.0) and doc["dtensor_param_step_us"] == pytest.approx(150)
    assert doc["optimizer_element_ns"] == pytest.approx(2.0)
    assert (doc["fsdp_gather_param_us"], doc["fsdp_reduce_param_us"], doc["fsdp_unit_step_us"]) == pytest.approx(
        (25, 20, 600))
    DeviceProfile.model_validate(doc)  # the simulator loads it
    fsdp = ("pass_step_s_per_rank", "copy_Bps", "dtensor_param_step_s", "optimizer_element_s", "gather_param_s",
            "reduce_param_s", "unit_step_s")
    bare = device_doc("d", {k: v for k, v in m.items() if k not in fsdp}, 1e9)
    assert not {"pass_flops_per_s", "memory_bandwidth_GBps", "dtensor_param_step_us", "optimizer_element_ns",
                "fsdp_gather_param_us", "fsdp_reduce_param_us", "fsdp_unit_step_us"} & set(bare)
