"""Fault injection in the simulator (sim/faults.py): goldens derived by hand, the engine
against the pure replay, seeded draws, the scenario's faults section and the report."""
from __future__ import annotations

import json
import math

import pytest

from oresearcher import ops as O
from oresearcher.errors import UserError
from oresearcher.scenario.faults import FaultsSpec
from oresearcher.reporting.report import Timeline
from oresearcher.scenario import load_scenario
from oresearcher.sim import faults as F
from oresearcher.sim.engine import Engine
from oresearcher.reporting.trace import to_chrome_trace
from simkit import DEVICE, meta, topo

RATE = 1e12  # DEVICE: 1 TFLOP/s, no host overhead


def _program(rank, steps, compute_s, nbytes=0):
    for s in range(steps):
        yield O.Compute(flops=compute_s * RATE, name="fwd_bwd")
        if nbytes:
            yield O.AllReduce(meta(nbytes), op="avg", algorithm="ring", name="grad")
        yield O.StepDone(s)


def _run(n, steps, compute_s, nbytes=0, spec=None, every=0, ckpt_bytes=0.0, bw=1.0):
    eng = Engine(topo(n), DEVICE, "fp32", "ring", Timeline(n))
    if spec is not None:
        eng.faults = F.FaultPlan(FaultsSpec.model_validate(spec), n, steps, every, ckpt_bytes, bw, seed=0)
    tl = eng.run([_program(r, steps, compute_s, nbytes) for r in range(n)])
    end = max(tl.step_ends[r][-1] for r in range(n))
    return end, tl, eng.faults


def test_straggler_on_one_rank_of_a_ring_golden():
    """4 ranks, 10 steps of c = 10 ms compute then a ring all-reduce of 1 MB taking a.
    Rank 2 is a straggler of factor f = 1.5. Every step the other three wait at the
    all-reduce for rank 2, so by hand:

        step time (fault-free) = c + a
        step time (straggler)  = f c + a = 15 ms + a
        goodput = (c + a) / (f c + a)

    a is the ring all-reduce of S = 1 MB on simkit's golden fabric (the straggler does not
    touch it): call 2 us + base 5 us + 2(n-1) hops x 1 us + 2(n-1)/n x S / 100 GB/s
    = 13 us + 15 us = 28 us. So 10.028 ms -> 15.028 ms a step, goodput 10.028 / 15.028
    = 0.66729."""
    n, steps, c, f = 4, 10, 0.010, 1.5
    a = (2 + 5 + 2 * (n - 1)) * 1e-6 + 2 * (n - 1) / n * 1e6 / 100e9
    assert a == pytest.approx(28e-6, rel=1e-12)
    base, _, _ = _run(n, steps, c, 10**6)
    assert base / steps == pytest.approx(c + a, rel=1e-9)
    slow, tl, plan = _run(n, steps, c, 10**6, {"stragglers": [{"ranks": [2], "factor": f}]})
    assert slow / steps == pytest.approx(15.028e-3, rel=1e-9)
    assert base / slow == pytest.approx(10.028 / 15.028, rel=1e-9)
    print(f"\nstraggler x{f}: step {1e3 * (c + a):.4f} ms -> {1e3 * slow / steps:.4f} ms (hand: "
          f"{1e3 * (f * c + a):.4f}); goodput {base / slow:.4f}")
    waits = [tl.totals[r]["peer_wait"] for r in range(n)]
    assert waits[2] < min(waits[r] for r in (0, 1, 3))  # the others wait for it, not it for them


def test_restart_from_the_last_checkpoint_golden_and_the_pure_replay_agree():
    """9 steps of 1 s, checkpoint every 3 steps costing C = 0.5 s (1 GB at 2 GB/s), a
    failure at 5.5 s, restart delay D = 2 s, restore R = C. By hand: steps end at 1, 2, 3;
    the checkpoint completes at 3.5; steps end at 4.5, 5.5 -- the failure: work since 3.5
    is recomputed (2 s, 2 steps), P = 2 + D + R = 4.5 s, so step 5 ends at 11, its
    checkpoint (6 steps) completes at 11.5, steps 6-8 end at 12.5, 13.5, 14.5 (no save
    after the last step). Total 14.5 s against 9 s fault-free: goodput 9 / 14.5."""
    spec = {"failures": [{"at_s": 5.5, "rank": 1}], "restart_delay_s": 2.0}
    end, tl, plan = _run(2, 9, 1.0, spec=spec, every=3, ckpt_bytes=1e9, bw=2e9)
    assert end == pytest.approx(14.5)
    (fail,) = plan.finish(tl, end)
    assert fail["recomputed_s"] == pytest.approx(2.0) and fail["steps_recomputed"] == 2
    assert fail["time_lost_s"] == pytest.approx(4.5) and fail["rollback_to_s"] == pytest.approx(3.5)
    assert plan.checkpoints == 2
    total, losses = F.replay([1.0] * 9, 3, 0.5, [5.5], 2.0, 0.5)
    assert total == pytest.approx(end) and losses[0]["time_lost_s"] == pytest.approx(4.5)
    assert 9 / total == pytest.approx(9 / 14.5)


def test_a_restart_is_one_pause_for_the_job_even_when_ranks_end_steps_apart():
    """Rank 1 ends its steps 0.5 s before rank 0 (each step: compute, StepDone, barrier).
    A failure at 0.4 s with D = 2 s: P = 0.4 + 2 = 2.4 s, taken from rank 1's StepDone at
    0.5 s; rank 0 (at 1.0 s) waits until 2.9 s, not a second P. The run ends P late, less
    at most the 0.5 s spread."""
    def prog(rank, steps):
        for s in range(steps):
            yield O.Compute(flops=(1.0 if rank == 0 else 0.5) * RATE)
            yield O.StepDone(s)
            yield O.Barrier()

    def end_of(spec):
        eng = Engine(topo(2), DEVICE, "fp32", "ring", Timeline(2))
        if spec:
            eng.faults = F.FaultPlan(FaultsSpec.model_validate(spec), 2, 3, 0, 0.0, 1.0, seed=0)
        tl = eng.run([prog(r, 3) for r in range(2)])
        return max(tl.step_ends[r][-1] for r in range(2))

    late = end_of({"failures": [{"at_s": 0.4}], "restart_delay_s": 2.0}) - end_of(None)
    assert 2.4 - 0.5 - 1e-9 <= late <= 2.4 + 1e-9


def test_a_failure_during_a_checkpoint_write_rolls_back_to_the_one_before():
    # the save of step 2 runs 3.0..3.5; a failure at 3.2 finds no complete checkpoint
    end, tl, plan = _run(2, 6, 1.0, spec={"failures": [{"at_s": 3.2}], "restart_delay_s": 1.0},
                         every=3, ckpt_bytes=1e9, bw=2e9)
    (fail,) = plan.finish(tl, end)
    assert fail["rollback_to_s"] == 0.0 and fail["restore_s"] == 0.0 and fail["recomputed_s"] == pytest.approx(3.2)
    assert end == pytest.approx(F.replay([1.0] * 6, 3, 0.5, [3.2], 1.0, 0.5)[0])


def test_continue_counts_the_lost_agents_time():
    """4 ranks of 1 s steps, 10 steps, rank 3 lost at 4 s and the others continue: no
    pause; the cluster loses (10 - 4) / 4 = 1.5 s of its time."""
    end, tl, plan = _run(4, 10, 1.0, spec={"failures": [{"at_s": 4.0, "rank": 3, "action": "continue"}]})
    (fail,) = plan.finish(tl, end)
    assert end == pytest.approx(10.0) and fail["time_lost_s"] == pytest.approx(1.5)
    assert any(s.cat == "fault" and s.rank == 3 and s.start == 4.0 for s in tl.spans)


def test_a_lost_node_takes_all_its_ranks():
    """8 ranks, 4 per node; the node of rank 5 (ranks 4-7) lost at 4 s of a 10 s run, the
    others continue: (10 - 4) x 4 agent-seconds, (10 - 4) x 4 / 8 = 3 s of the cluster's time."""
    spec = FaultsSpec.model_validate({"failures": [{"at_s": 4.0, "rank": 5, "scope": "node", "action": "continue"}]})
    eng = Engine(topo(8), DEVICE, "fp32", "ring", Timeline(8))
    eng.faults = plan = F.FaultPlan(spec, 8, 10, 0, 0.0, 1.0, seed=0, gpus_per_node=4)
    tl = eng.run([_program(r, 10, 1.0) for r in range(8)])
    (fail,) = plan.finish(tl, 10.0)
    assert fail["ranks_lost"] == 4 and fail["time_lost_s"] == pytest.approx(3.0)
    assert sorted(s.rank for s in tl.spans if s.cat == "fault") == [4, 5, 6, 7]


def test_link_window_slows_only_flows_started_inside_it():
    base, _, _ = _run(4, 3, 0.01, 10**7)
    late, _, _ = _run(4, 3, 0.01, 10**7, {"links": [{"start_s": 100.0, "duration_s": 1.0, "bandwidth_factor": 0.5}]})
    hit, _, _ = _run(4, 3, 0.01, 10**7, {"links": [{"start_s": 0.0, "duration_s": 100.0, "bandwidth_factor": 0.5}]})
    assert late == base and base < hit < 2 * base  # the compute and latencies do not slow down
    plan = F.FaultPlan(FaultsSpec.model_validate({"links": [{"start_s": 1, "duration_s": 2, "bandwidth_factor": 0.25}]}),
                       2, 1, 0, 0, 1, 0)
    assert plan.flow_bytes(0.5, [100.0]) == [100.0] and plan.flow_bytes(1.0, [100.0, 8.0]) == [400.0, 32.0]
    assert plan.flow_bytes(3.0, [100.0]) == [100.0]


def test_seeded_straggler_draws():
    spec = FaultsSpec.model_validate({"stragglers": [{"distribution": "lognormal", "cv": 0.2},
                                                     {"ranks": [1], "distribution": "uniform", "low": 2, "high": 3}]})
    a = F.straggler_factors(spec.stragglers, 4000, seed=5)
    assert a == F.straggler_factors(spec.stragglers, 4000, seed=5) != F.straggler_factors(spec.stragglers, 4000, 6)
    others = [x for i, x in enumerate(a) if i != 1]
    mean = sum(others) / len(others)
    sd = math.sqrt(sum((x - mean) ** 2 for x in others) / len(others))
    assert mean == pytest.approx(1.0, abs=0.02) and sd / mean == pytest.approx(0.2, abs=0.02)
    assert 2 <= a[1] / F.straggler_factors(spec.stragglers[:1], 4000, 5)[1] <= 3


def test_random_failures_follow_the_seeded_stream():
    times = F.failure_times(100.0, seed=3, horizon_s=1e6)
    assert times == F.failure_times(100.0, seed=3, horizon_s=1e6)
    assert len(times) / 1e6 == pytest.approx(1 / 100.0, rel=0.05)
    end, tl, plan = _run(2, 50, 1.0, spec={"mtbf_s": 20.0, "restart_delay_s": 1.0}, every=5, ckpt_bytes=1e8, bw=1e9)
    got = [f.at_s for f in plan.failures if f.loss is not None]
    assert got == F.failure_times(20.0, 0, got[-1]) and len(got) >= 2
    assert end == pytest.approx(F.replay([1.0] * 50, 5, 0.1, F.failure_times(20.0, 0, end), 1.0, 0.1)[0])


def test_young_daly():
    assert F.young_daly(30.0, 3600.0) == pytest.approx(math.sqrt(2 * 30 * 3600))


@pytest.mark.parametrize("bad, words", [
    ("faults.stragglers=[{ranks: [9], factor: 2}]", "rank 9 is outside the 8 ranks"),
    ("faults.stragglers=[{factor: 2, distribution: uniform}]", "a fixed factor or a distribution"),
    ("faults.stragglers=[{factor: .inf}]", "faults.stragglers.0.factor"),
    ("faults.links=[{start_s: 1, duration_s: 0}]", "faults.links.0.duration_s"),
    ("faults.links=[{start_s: 1, duration_s: 1, bandwidth_factor: 2}]", "bandwidth_factor"),
    ("faults.failures=[{at_s: true}]", "not true/false"),
    ("faults.failures=[{at_s: 5, action: continue}]", "ddp needs every rank"),
    ("faults.mtbf_s=-1", "faults.mtbf_s"),
    ("faults.typo=1", "faults.typo"),
])
def test_the_faults_section_is_validated(bad, words):
    with pytest.raises(UserError, match=words.replace("[", r"\[")):
        load_scenario("scenarios/8xA100.yaml", ["training.strategy=ddp", bad])


def test_simulate_reports_time_lost_per_fault_and_the_trace_shows_them():
    from oresearcher.sim.simulate import simulate

    sc = load_scenario("scenarios/8xA100.yaml", [
        "training.strategy=ddp", "training.steps=6", "training.checkpoint_every=2",
        "faults.stragglers=[{ranks: [3], factor: 1.5}]", "faults.failures=[{at_s: 6, rank: 2}]",
        "faults.links=[{start_s: 1, duration_s: 2, bandwidth_factor: 0.1}]"])
    report, tl = simulate(sc, keep_spans=10_000)
    f = report["faults"]
    ckpt = f["checkpoints"]
    assert ckpt["seconds_each"] == pytest.approx(ckpt["bytes_per_rank"] / 2e9) and ckpt["count"] == 2
    parts = ckpt["time_lost_s"] + f["stragglers"]["time_lost_s"] + f["links"]["time_lost_s"] + f["failures"][0]["time_lost_s"]
    assert f["time_total_s"] == pytest.approx(f["time_fault_free_s"] + parts, rel=1e-3)  # the kinds add up here
    assert f["goodput"] == pytest.approx(f["time_fault_free_s"] / f["time_total_s"])
    assert f["failures"][0]["restart_s"] == 60.0 and f["work_recomputed_s"] > 0
    names = {e["name"] for e in to_chrome_trace(tl)["traceEvents"] if e.get("cat") == "fault"}
    assert {"checkpoint", "straggler x1.50", "link bandwidth x0.1", "restart: rank 2 lost at 6.0 s"} <= names
    json.dumps(report)
    from rich.console import Console

    con = Console(record=True, width=120)
    con.print(F.faults_table(f))
    text = con.export_text()
    assert "rank 2 lost at 6.0 s: restart (delay 60 s" in text and f"goodput {f['goodput']:.1%}" in text


def test_the_memory_model_runs_once_and_prices_the_checkpoints(monkeypatch):
    """The report's memory figures and the bytes each checkpoint writes come from one run
    of the memory model (a second run could differ from the first: they are one figure)."""
    from oresearcher.sim import simulate as S

    calls = []
    real = S.memory_report
    monkeypatch.setattr(S, "memory_report", lambda *a: calls.append(a) or real(*a))
    sc = load_scenario("scenarios/8xA100.yaml", ["training.strategy=ddp", "training.steps=4",
                                                 "training.checkpoint_every=2", "faults.price_checkpoints=true"])
    report, _ = S.simulate(sc, keep_spans=0)
    mem = report["memory"]
    assert report["faults"]["checkpoints"]["bytes_per_rank"] == mem["weights"] + mem["optimizer_state"]
    assert len(calls) == 2  # the run, and its fault-free baseline (a run of its own)
