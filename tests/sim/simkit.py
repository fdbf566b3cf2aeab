"""Shared helpers for the simulator tests (on the pytest pythonpath)."""
import torch

from oresearcher import ops as O
from oresearcher.sim.engine import Engine
from oresearcher.hardware import DeviceProfile, FabricProfile
from oresearcher.comm import build_topology

# A made-up fabric with round numbers so golden times can be derived by hand.
FABRIC = dict(kind="fabric", name="golden", topology="switch", bandwidth_GBps=100.0, efficiency=1.0,
              base_latency_us=5.0, hop_latency_us=1.0, call_overhead_us=2.0)
DEVICE = DeviceProfile(name="golden-dev", peak_flops={"fp32": 1e12}, efficiency=1.0, memory_bytes=1e9,
                       host_overhead_us=0.0)


def fabric(**kw):
    return FabricProfile(**{**FABRIC, **kw})


def topo(n, gpus_per_node=None, inter=None, **kw):
    return build_topology(n, gpus_per_node or n, fabric(**kw), inter, 1 if inter is None else gpus_per_node)


def time_one(t, make_op, algorithm="ring"):
    """Simulated seconds until every rank finished one op built by make_op(rank)."""
    def prog(r):
        yield make_op(r)
        yield O.StepDone(0)
    eng = Engine(t, DEVICE, "fp32", algorithm)
    tl = eng.run([prog(r) for r in range(t.world_size)])
    return max(tl.step_ends[r][-1] for r in range(t.world_size)), tl


def meta(nbytes):
    return torch.empty(nbytes // 4, device="meta")

