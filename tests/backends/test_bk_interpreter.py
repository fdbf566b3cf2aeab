"""The interpreter in this process on a one-rank gloo group: timing, step statistics and
errors. (Results across ranks are checked by test_bk_multiprocess.py.)"""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from oresearcher import ops as O
from oresearcher.backends.interpreter import Interpreter, make_clock
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
