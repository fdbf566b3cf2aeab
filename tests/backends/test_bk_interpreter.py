"""The interpreter in this process on a one-rank gloo group: timing, step statistics and
errors. (Results across ranks are checked by test_bk_multiprocess.py.)"""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from oresearcher import ops as O
from oresearcher.backends.run.interpreter import Interpreter, make_clock
from oresearcher.reporting.report import Timeline, summarize


@pytest.fixture(scope="module")
def world1():
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def _interp(**kw):
    tl = Timeline(1)
    return Interpreter(0, 1, device=torch.device("cpu"), timeline=tl, clock=make_clock(), **kw), tl


def test_spans_and_step_stats(world1):
    steps = []
    it, tl = _interp(on_step=lambda s, m, st: steps.append((s, m, st)), step_offset=10)

    def prog():
        x = yield O.Compute(lambda: (time.sleep(0.02), torch.ones(4))[1], name="work")
        y = yield O.AllReduce(x, op="avg")
        h = yield O.AllGather(y, async_op=True)
        yield O.Compute(time.sleep, 0.01, name="overlap")
        got = yield O.Wait(h)
        assert torch.equal(got[0], torch.ones(4))
        yield O.StepDone(0, {"loss": torch.tensor(1.5), "role": "optimizer"})

    it.run(prog())
    cats = {}
    for s in tl.spans:
        assert s.end >= s.start
        cats.setdefault(s.cat, []).append(s.name)
    assert cats["compute"] == ["work", "overlap"]
    assert sorted(cats["comm"]) == ["all_gather", "all_reduce"]
    # the blocking all-reduce (from its issue), issuing the async all-gather, the Wait
    assert cats["blocked"] == ["blocked:all_reduce", "issue:all_gather", "blocked:all_gather"]
    (step, metrics, stats), = steps
    assert step == 10 and metrics == {"loss": 1.5, "role": "optimizer"}  # tensors became numbers
    assert stats["compute_s"] >= 0.03 and stats["duration_s"] >= stats["compute_s"]
    assert tl.step_ends[0] and tl.metrics[0][0][0] == 10
    rep = summarize(tl, {}, "gloo")
    assert rep["steps"] == 1 and rep["compute_time_s"] >= 0.03 and rep["wire_bytes_per_step"] == 0  # one rank sends nothing


def test_unwaited_async_work_is_drained(world1):
    it, tl = _interp()

    def prog():
        yield O.AllReduce(torch.ones(3), async_op=True, name="forgotten")

    it.run(prog())
    assert [s.name for s in tl.spans if s.cat == "comm"] == ["forgotten"] and not it.inflight


def test_avg_divides_once_even_when_waited_twice(world1):
    it, _ = _interp()
    out = []

    def prog():
        h = yield O.AllReduce(torch.full((2,), 3.0), op="avg", async_op=True)
        out.append((yield O.Wait(h)).clone())
        out.append((yield O.Wait(h)).clone())

    it.run(prog())
    assert torch.equal(out[0], torch.full((2,), 3.0)) and torch.equal(out[1], out[0])


@pytest.mark.parametrize("bad, match", [
    (lambda: O.AllReduce(torch.empty(3, device="meta")), "meta tensor"),
    (lambda: O.AllReduce(torch.ones(1), group=(1,)), "bad group"),
    (lambda: "not an op", "not an op"),
    (lambda: O.Wait(O.Handle(O.Barrier(), token="foreign")), "not a handle"),
])
def test_mistakes_are_named(world1, bad, match):
    it, _ = _interp()

    def prog():
        yield bad()

    with pytest.raises((ValueError, TypeError), match=match):
        it.run(prog())


# ---- one program mistake, one error type: the same bad program fed to every interpreter ----
def _bad(make):
    def prog():
        yield make()
    return prog


BAD_PROGRAMS = {  # op -> words every interpreter's ProgramError holds
    "not an op": (lambda: "not an op", "which is not an op"),
    "group it is not in": (lambda: O.AllReduce(torch.ones(1), group=(0, 1)), "bad group (0, 1) for world size 1"),
    "foreign handle": (lambda: O.Wait(O.Handle(O.Barrier(), token="foreign")),
                       "Wait on 'foreign', which is not a handle"),
    "all-to-all count": (lambda: O.AllToAll([torch.ones(1), torch.ones(1)]), "AllToAll: 2 tensors for a group of 1"),
    "reduce op": (lambda: O.AllReduce(torch.ones(1), op="prod"), "AllReduce op must be one of"),
}


@pytest.mark.parametrize("case", BAD_PROGRAMS, ids=list(BAD_PROGRAMS))
def test_the_same_mistake_is_the_same_error_in_every_interpreter(world1, case):
    from oresearcher.sim.engine import Engine
    from oresearcher.hardware import DeviceProfile, FabricProfile
    from oresearcher.comm import build_topology
    from oresearcher.testing import run_programs

    make, words = BAD_PROGRAMS[case]
    fab = FabricProfile(name="f", topology="switch", bandwidth_GBps=1.0, efficiency=1.0, base_latency_us=1.0,
                        hop_latency_us=1.0, call_overhead_us=1.0)
    dev = DeviceProfile(name="d", peak_flops={"fp32": 1e9}, efficiency=1.0, memory_bytes=1e9, host_overhead_us=0.0)
    runs = {
        "real": lambda: _interp()[0].run(_bad(make)()),
        "sim": lambda: Engine(build_topology(1, 1, fab, None, 1), dev, "fp32").run([_bad(make)()]),
        "reference": lambda: run_programs([_bad(make)()]),
    }
    for name, run in runs.items():
        with pytest.raises(O.ProgramError) as e:
            run()
        assert words in str(e.value), (name, str(e.value))
