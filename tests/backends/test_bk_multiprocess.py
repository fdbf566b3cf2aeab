"""Real gloo process groups of 2 and 4 ranks: the backend's results equal the reference
interpreter's and the simulator's numeric mode (exactly for integer-valued inputs, within
fp32 tolerance for random ones), and its timeline holds what the report needs.

One launch per world size runs every op (bk_programs.exercise); the assertions share it.
"""
from __future__ import annotations

import sys

import pytest
import torch

from bk_helpers import HERE, child_environment, write_scenario
from oresearcher.backends.run.launcher import launch_local
from oresearcher.scenario import load_scenario
from oresearcher.testing import run_programs

import bk_programs


@pytest.fixture(scope="module", params=[2, 4])
def launched(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"mp{n}")
    result = launch_local([sys.executable, str(HERE / "bk_mp_worker.py"), str(out)], n, timeout_s=60,
                          env=child_environment())
    assert result.ok, result
    return n, [torch.load(out / f"rank-{r}.pt", weights_only=False) for r in range(n)]


def _same(kind, a, b):
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(kind, x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a, b) if kind == "exact" else torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    return a == b


def _check(n, got, expected):
    for r in range(n):
        names = [name for _, name, _ in expected[r]]
        assert [name for _, name, _ in got[r]] == names
        for (kind, name, a), (_, _, b) in zip(got[r], expected[r]):
            assert _same(kind, a, b), f"rank {r} {name}: {a} != {b}"


def test_results_equal_the_reference_interpreter(launched):
    n, saved = launched
    expected = [[] for _ in range(n)]
    run_programs([bk_programs.exercise(r, n, expected[r]) for r in range(n)])
    _check(n, [s["results"] for s in saved], expected)


def test_results_equal_the_simulators_numeric_mode(launched, tmp_path):
    from oresearcher.reporting.report import Timeline
    from oresearcher.sim.engine import Engine
    from oresearcher.sim.simulate import build_cluster

    n, saved = launched
    scenario = load_scenario(write_scenario(tmp_path / "s.yaml", agents={"count": n}))
    device, topo = build_cluster(scenario)
    expected = [[] for _ in range(n)]
    Engine(topo, device, "fp32", "ring", Timeline(n)).run([bk_programs.exercise(r, n, expected[r]) for r in range(n)])
    _check(n, [s["results"] for s in saved], expected)


def test_timeline_spans_carry_ring_wire_bytes(launched):
    n, saved = launched
    for r, s in enumerate(saved):
        comm = {name: w for cat, name, a, b, w in s["spans"] if cat == "comm"}
        assert comm["async_a"] == 2 * (n - 1) * 1000 * 4 // n  # ring all-reduce: 2(n-1)/n of 4 kB
        assert comm["all_gather"] == (n - 1) * 4 * 4  # all-gather: the n-1 foreign 16-byte parts
        assert comm["send"] == 3 * 4 and comm["barrier"] == 0
        assert all(b >= a for _, _, a, b, _ in s["spans"])
        blocked = [name for cat, name, *_ in s["spans"] if cat == "blocked"]
        assert "blocked:async_a" in blocked and "blocked:recv" in blocked


def test_rank0_report_merges_every_rank(launched):
    n, saved = launched
    rep = saved[0]["report"]
    assert rep["world_size"] == n and rep["steps"] == 2
    assert sorted(rep["metrics"]) == [str(r) for r in range(n)]
    assert rep["metrics"][str(n - 1)][0]["loss"] == float(n - 1)
    assert rep["wire_bytes_per_step"] > 0 and 0 < rep["comm_overhead"] <= 1
    names = {b["name"] for b in rep["breakdown"]}
    assert {"all_reduce", "reduce_scatter", "all_to_all", "broadcast", "async_a"} <= names
    assert all(s["report"] is None for s in saved[1:])
