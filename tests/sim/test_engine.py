"""The SimPy interpreter: numeric results equal the reference interpreter, overlap, determinism."""
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher import ops as O
from oresearcher.reporting.report import summarize
from oresearcher.scenario import load_scenario
from oresearcher.sim.engine import Engine
from oresearcher.sim.simulate import simulate
from oresearcher.testing import run_programs

from simkit import DEVICE, topo


def mixed_program(rank, n, seed, size):
    """A program touching every collective; returns what it received via StepDone."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randint(-50, 50, (size * n,), generator=g).float()
    out = {}
    out["ar"] = yield O.AllReduce(x)
    h = yield O.AllReduce(x * 2, op="max", async_op=True)
    out["rs"] = yield O.ReduceScatter(x)
    out["ag"] = torch.cat((yield O.AllGather(x[:size])))
    out["a2a"] = torch.cat((yield O.AllToAll(list(x.split(size)))))
    out["bc"] = yield O.Broadcast(x, src=n - 1)
    out["max"] = yield O.Wait(h)
    if n > 1:
        if rank == 0:
            yield O.Send(x, dst=1)
        elif rank == 1:
            out["p2p"] = yield O.Recv(torch.empty_like(x), src=0)
    yield O.Barrier()
    yield O.StepDone(0, {k: v.tolist() for k, v in out.items()})


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(0, 1000), st.integers(1, 5))
def test_numeric_mode_equals_reference_interpreter(n, seed, size):
    ref = run_programs([mixed_program(r, n, seed, size) for r in range(n)])
    tl = Engine(topo(n), DEVICE, "fp32").run([mixed_program(r, n, seed, size) for r in range(n)])
    for r in range(n):
        assert tl.metrics[r][0][2] == ref[r][0].metrics  # integer-valued: exact


def test_overlap_hides_communication_behind_compute():
    n = 4

    def prog(overlap):
        def p(rank):
            handles = []
            for _ in range(4):
                yield O.Compute(flops=1e9)  # 1 ms each on the 1 TFLOP/s golden device
                handles.append((yield O.AllReduce(torch.empty(2**20, device="meta"), async_op=overlap)))
            if overlap:
                for h in handles:
                    yield O.Wait(h)
            yield O.StepDone(0)
        return p

    t = topo(n)
    over = summarize(Engine(t, DEVICE).run([prog(True)(r) for r in range(n)]), {}, "sim")
    sync = summarize(Engine(t, DEVICE).run([prog(False)(r) for r in range(n)]), {}, "sim")
    assert over["comm_time_s"] == pytest.approx(sync["comm_time_s"], rel=0.01)
    assert over["exposed_comm_time_s"] < 0.5 * sync["exposed_comm_time_s"]
    assert over["step_time_s"] < sync["step_time_s"]
    assert sync["exposed_comm_time_s"] == pytest.approx(sync["comm_time_s"], rel=1e-9)


def test_mismatched_collectives_are_reported():
    def p(rank):
        yield (O.AllReduce(torch.zeros(4)) if rank == 0 else O.AllGather(torch.zeros(4)))
    with pytest.raises(RuntimeError, match="met"):
        Engine(topo(2), DEVICE).run([p(0), p(1)])


def test_deadlock_is_reported_not_hung():
    def p(rank):
        if rank == 0:
            yield O.AllReduce(torch.zeros(4))
    with pytest.raises(RuntimeError, match="deadlock"):
        Engine(topo(2), DEVICE).run([p(0), p(1)])


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.sampled_from(["ddp", "local_sgd", "oresearcher"]),
       st.sampled_from(["shape", "numeric"]))
def test_same_scenario_same_report_byte_for_byte(seed, steps, strategy, mode):
    sets = [f"seed={seed}", f"training.steps={steps}", f"training.strategy={strategy}", f"simulation.mode={mode}",
            "training.local_steps=2", "communication.interval=2"]
    a, _ = simulate(load_scenario("scenarios/cpu-tiny.yaml", sets))
    b, _ = simulate(load_scenario("scenarios/cpu-tiny.yaml", sets))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_numeric_synthetic_lm_trains_and_reports_loss():
    s = load_scenario("scenarios/cpu-tiny.yaml", ["training.steps=30", "simulation.mode=numeric", "training.lr=0.003"])
    report, _ = simulate(s)
    losses = [m["loss"] for m in report["metrics"]["0"]]
    assert len(losses) == 30 and losses[-1] < losses[0] - 0.5


def test_ddp_numeric_keeps_agents_identical():
    s = load_scenario("scenarios/cpu-tiny.yaml", ["training.steps=3", "simulation.mode=numeric"])
    report, _ = simulate(s)
    finals = {r: ms[-1]["loss"] for r, ms in report["metrics"].items()}
    assert len(finals) == 4  # different data per rank, but every rank reports


def test_waiting_for_a_slower_peer_is_reported_apart_from_transfer():
    def p(rank):
        yield O.Compute(flops=1e9 * (1 + rank))  # rank 1 arrives 1 ms later (1 TFLOP/s device)
        yield O.AllReduce(torch.empty(1024, device="meta"))
        yield O.StepDone(0)
    r = summarize(Engine(topo(2), DEVICE).run([p(0), p(1)]), {}, "sim")
    assert r["peer_wait_time_s"] == pytest.approx(0.5e-3, rel=1e-9)  # mean of 1 ms and 0
    transfer = (2 + 5 + 2) * 1e-6 + 4096 / 100e9  # call + base + 2 hops + 4 KiB at 100 GB/s
    assert r["comm_time_s"] == pytest.approx(0.5e-3 + transfer, rel=1e-9)
    assert r["exposed_comm_time_s"] >= r["peer_wait_time_s"]


def test_equal_groups_passed_as_different_objects_meet():
    def p(rank):
        out = yield O.AllReduce(torch.ones(2), group=[0, 1] if rank == 0 else (1, 0))
        yield O.StepDone(0, {"sum": out.tolist()})
    tl = Engine(topo(2), DEVICE).run([p(0), p(1)])
    assert tl.metrics[0][0][2]["sum"] == [2.0, 2.0] == tl.metrics[1][0][2]["sum"]


def test_ring_of_sends_then_receives_does_not_deadlock():
    n = 3

    def p(rank):
        yield O.Send(torch.full((4,), float(rank)), dst=(rank + 1) % n)
        got = yield O.Recv(torch.empty(4), src=(rank - 1) % n)
        yield O.StepDone(0, {"got": got[0].item()})
    ref = run_programs([p(r) for r in range(n)])
    tl = Engine(topo(n), DEVICE).run([p(r) for r in range(n)])
    for r in range(n):
        assert tl.metrics[r][0][2]["got"] == ref[r][0].metrics["got"] == (r - 1) % n


def _collective_end(t, a, b=None):
    """Finish time of collective ``a`` = (kind, algorithm, ranks, nbytes), alone or with ``b``
    (same form plus a start delay in seconds) running on the same network."""
    def prog(rank):
        ha = hb = None
        if b is not None and rank in b[2]:
            if b[4]:
                yield O.Compute(flops=b[4] * 1e12)  # 1 TFLOP/s golden device: delay in seconds
            hb = yield _op(b, rank)
        if rank in a[2]:
            ha = yield _op(a, rank)
        for h in (ha, hb):
            if h is not None:
                yield O.Wait(h)
        yield O.StepDone(0)
    tl = Engine(t, DEVICE, "fp32").run([prog(r) for r in range(t.world_size)])
    return max(s.end for s in tl.spans if s.cat == "comm" and s.name == "A")


def _op(spec, rank):
    kind, algo, ranks, nbytes = spec[:4]
    name = "A" if len(spec) == 4 else "B"
    x = torch.empty(max(1, nbytes // 4) * len(ranks), device="meta")
    if kind == "AllReduce":
        return O.AllReduce(x, group=ranks, async_op=True, algorithm=algo, name=name)
    if kind == "AllGather":
        return O.AllGather(x, group=ranks, async_op=True, algorithm=algo, name=name)
    if kind == "ReduceScatter":
        return O.ReduceScatter(x, group=ranks, async_op=True, algorithm=algo, name=name)
    return O.AllToAll(list(x.chunk(len(ranks))), group=ranks, async_op=True, algorithm=algo, name=name)


_coll = st.tuples(st.sampled_from(["AllReduce", "AllGather", "ReduceScatter", "AllToAll"]),
                  st.sampled_from(["ring", "tree", "direct", "halving_doubling", "hierarchical"]),
                  st.sets(st.integers(0, 7), min_size=2, max_size=8).map(lambda s: tuple(sorted(s))),
                  st.integers(1, 2**24))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["switch", "pcie", "two-node"]), _coll, _coll, st.floats(0.0, 2e-3))
def test_a_concurrent_collective_never_lets_a_collective_finish_earlier(kind, a, b, delay):
    from oresearcher.comm import build_topology
    from simkit import fabric

    if kind == "switch":
        t = topo(8)
    elif kind == "pcie":
        t = build_topology(8, 8, fabric(topology="pcie", shared_bandwidth_GBps=150.0))
    else:
        t = build_topology(8, 4, fabric(), fabric(name="ib", topology="network", bandwidth_GBps=25.0), 2)
    alone = _collective_end(t, a)
    assert _collective_end(t, a, (*b, delay)) >= alone * (1 - 1e-9)
