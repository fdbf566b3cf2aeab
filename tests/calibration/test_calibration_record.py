"""The typed measurement record passed from the backend's measurement through the fabric
fit, the jitter statistics and the profile documents to the CLI."""
import dataclasses
from pathlib import Path

import pytest

from oresearcher.calibrate import write_profile
from oresearcher.calibration.profiles import compute_rate, device_doc, pass_rate
from oresearcher.calibration.record import Measurement


def record(**kw):
    base = dict(flops_per_step=2e9, compute_step_s=0.1, host_overhead_s=5e-6, world_size=2, backend="gloo",
                dtype="fp32", strategy="ddp", call_overhead_s=2e-5,
                collectives=[{"kind": "AllReduce", "bytes": b, "time_s": 1e-4 + b / 1e9} for b in (1024, 65536, 2**20)]
                + [{"kind": "AllGather", "bytes": b, "time_s": 6e-5 + b / 2e9} for b in (1024, 65536, 2**20)])
    return Measurement(**{**base, **kw})


def test_a_mapping_becomes_a_record_and_a_stray_key_is_named():
    m = Measurement.of({"flops_per_step": 1e9, "compute_step_s": 0.1, "host_overhead_s": 0.0})
    assert isinstance(m, Measurement) and m.mean_step_s == 0.1 and m.sync_period == 1 and m.roofline is None
    assert Measurement.of(m) is m
    with pytest.raises(TypeError, match="not measurement fields: compute_steps"):
        Measurement.of({"flops_per_step": 1e9, "compute_step_s": 0.1, "host_overhead_s": 0.0, "compute_steps": 3})


def test_the_record_is_frozen_and_changes_make_a_new_one():
    m = record()
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.sync_period = 4
    assert m.with_(sync_period=4).sync_period == 4 and m.sync_period == 1


def test_a_record_and_the_same_mapping_give_the_same_profile():
    m = record(compute_step_s_mean=0.08)
    assert compute_rate(m, jitter=True) == compute_rate(dataclasses.asdict(m), jitter=True) == pytest.approx(2.5e10)
    assert device_doc("d", m, 1e9) == device_doc("d", dataclasses.asdict(m), 1e9)


def test_write_profile_takes_the_record_end_to_end(tmp_path):
    from oresearcher.hardware import load_profile_file

    fit = write_profile(tmp_path / "p.yaml", record(), "cpu-cal", "gloo-cal")
    dev, fab = load_profile_file(tmp_path / "p.yaml")
    assert (dev.name, fab.name) == ("cpu-cal", "gloo-cal") and fab.bandwidth == pytest.approx(fit.bandwidth_Bps)
    assert dev.flops_per_s("fp32") == pytest.approx(2e9 / 0.1)
    assert "ddp program declares 2e+09 FLOP" in (tmp_path / "p.yaml").read_text()


def test_a_fit_the_simulator_would_refuse_is_refused_by_calibrate_and_nothing_is_written(tmp_path):
    """Collectives timed on a machine too busy to measure (a MB taking seconds) fit a
    bandwidth below what a fabric profile accepts: calibrate says so in one line and
    leaves no profile behind, instead of a profile the simulator refuses later."""
    from oresearcher.errors import UserError

    slow = [{"kind": "AllReduce", "bytes": b, "time_s": 1e-4 + b / 1e5} for b in (1024, 65536, 2**20)]
    with pytest.raises(UserError) as e:
        write_profile(tmp_path / "p.yaml", record(collectives=slow), "cpu-cal", "gloo-cal")
    assert "\n" not in str(e.value) and "cannot be calibrated" in str(e.value) and "GB/s" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_a_host_too_busy_to_describe_is_capped_at_the_profiles_bound_and_still_loads(tmp_path):
    """A measured spread beyond what a device profile accepts (compute_jitter_cv <= 2) is
    written as the bound, said in the profile's comment, and the profile loads."""
    from oresearcher.calibration.jitter import op_jitter_cv, own_slowness, pooled_cv
    from oresearcher.hardware import JITTER_CV_MAX, load_profile_file

    spiky = [0.01] * 19 + [5.0]  # one stall of 500x in twenty steps, on one rank only
    steps = [spiky, [0.01] * 20]
    m = record(step_seconds_per_rank=steps, compute_step_s_mean=0.05, op_flops=[[1e9, 1e9]] * 20)
    raw = op_jitter_cv(pooled_cv(own_slowness(steps)), m.op_flops, compute_rate(m, jitter=True), m.host_overhead_s)
    assert raw > JITTER_CV_MAX  # the measurement itself is past the bound
    assert device_doc("d", m, 1e9, jitter=True)["compute_jitter_cv"] == JITTER_CV_MAX
    write_profile(tmp_path / "p.yaml", m, "cpu-cal", "gloo-cal", jitter=True)
    dev, _ = load_profile_file(tmp_path / "p.yaml")
    assert dev.compute_jitter_cv == JITTER_CV_MAX
    assert f"capped at {JITTER_CV_MAX:g}" in (tmp_path / "p.yaml").read_text()


def test_ranks_with_different_work_give_each_rank_its_own_rate():
    # rank 0 hosts agents with a small share (1 GFLOP in 0.1 s), rank 1 the big one
    # (3 GFLOP in 0.2 s); 10 ops a step at 5 us each come off both. By hand: rates
    # 1e9 / 0.09995 and 3e9 / 0.19995; the slowest is rank 0's, the mean 4e9 / 0.2999.
    m = record(flops_per_step=1e9, compute_step_s=0.2, compute_step_s_mean=0.15, compute_ops_per_step=10,
               flops_per_step_per_rank=[1e9, 3e9], compute_step_s_per_rank=[0.1, 0.2],
               compute_ops_per_step_per_rank=[10, 10])
    assert compute_rate(m) == pytest.approx(1e9 / 0.09995)
    assert compute_rate(m, jitter=True) == pytest.approx(4e9 / 0.2999)
    # the passes alone the same way: 1 GFLOP in 0.05 s and 3 GFLOP in 0.1 s, 4 pass ops a step
    passes = m.with_(pass_step_s_per_rank=[0.05, 0.1], pass_ops_per_step=4)
    assert pass_rate(passes) == pytest.approx(min(1e9 / 0.04998, 3e9 / 0.09998))
    assert pass_rate(passes, jitter=True) == pytest.approx(4e9 / 0.14996)
    # the same FLOPs on every rank: rank 0's count over the slowest rank, as before
    same = m.with_(flops_per_step_per_rank=[1e9, 1e9])
    assert compute_rate(same) == pytest.approx(1e9 / (0.2 - 10 * 5e-6))
    assert compute_rate(same, jitter=True) == pytest.approx(1e9 / (0.15 - 10 * 5e-6))


def test_a_hosted_program_is_timed_in_rounds():
    from oresearcher.backends.calibration.measure import steps_per_report
    from oresearcher.scenario import load_scenario

    scenarios = Path(__file__).resolve().parents[2] / "scenarios"
    hosted = load_scenario(scenarios / "alloc-8on4.yaml")
    assert steps_per_report(hosted) == hosted.communication.interval > 1
    assert steps_per_report(load_scenario(scenarios / "digits-4.yaml")) == 1
    assert steps_per_report(load_scenario(scenarios / "cpu-tiny.yaml")) == 1


def _fsdp_record(**kw):
    micro = dict(copy_Bps=10e9, dtensor_param_step_s=100e-6, optimizer_element_s=4e-9, gather_param_s=30e-6,
                 reduce_param_s=25e-6, unit_step_s=600e-6)
    step = {"passes_s": [0.020, 0.022], "copies_s": [0.006, 0.008], "optimizer_s": [0.006, 0.007],
            "comm_s": [0.030, 0.031],
            "schedule": {"copies_s": 0.004, "optimizer_s": 0.005, "hooks_s": 0.003, "pass_flops": 6.0e8}}
    return record(strategy="fsdp", **{**micro, "fsdp_step": step, **kw})


def test_fsdp_constants_scaled_to_the_programs_own_step_by_hand():
    from oresearcher.calibration.profiles import fsdp_fit

    m = _fsdp_record()
    # slowest rank: copies 8 ms over the schedule's 4 -> x2; optimizer 7 over 5 -> x1.4;
    # passes 22 - 3 ms of hooks = 19 ms for 6e8 FLOP
    fit = fsdp_fit(m)
    assert fit["copies_factor"] == pytest.approx(2.0) and fit["optimizer_factor"] == pytest.approx(1.4)
    assert fit["memory_bandwidth_GBps"] == pytest.approx(5.0)
    assert fit["fsdp_gather_param_us"] == pytest.approx(60.0) and fit["fsdp_reduce_param_us"] == pytest.approx(50.0)
    assert fit["dtensor_param_step_us"] == pytest.approx(140.0) and fit["optimizer_element_ns"] == pytest.approx(5.6)
    assert fit["pass_flops_per_s"] == pytest.approx(6e8 / 0.019)
    # with jitter the mean rank: copies 7 / 4, optimizer 6.5 / 5, passes 21 - 3 ms
    fit = fsdp_fit(m, jitter=True)
    assert fit["copies_factor"] == pytest.approx(1.75) and fit["optimizer_factor"] == pytest.approx(1.3)
    assert fit["pass_flops_per_s"] == pytest.approx(6e8 / 0.018)
    # the device profile carries the scaled constants, and its rate is the passes'
    doc = device_doc("d", m, 1e9)
    assert doc["peak_flops"]["fp32"] == doc["pass_flops_per_s"] == pytest.approx(6e8 / 0.019)
    assert doc["memory_bandwidth_GBps"] == pytest.approx(5.0) and doc["dtensor_param_step_us"] == pytest.approx(140.0)
    assert "copies_factor" not in doc
    # without the step timed, the microbenchmarks' constants as they were
    plain = device_doc("d", m.with_(fsdp_step=None), 1e9)
    assert fsdp_fit(m.with_(fsdp_step=None)) is None
    assert plain["memory_bandwidth_GBps"] == pytest.approx(10.0) and plain["dtensor_param_step_us"] == pytest.approx(100.0)


def test_fsdp_step_that_cannot_be_split_is_one_line(tmp_path):
    from oresearcher.calibration.profiles import fsdp_fit
    from oresearcher.errors import UserError

    m = _fsdp_record()
    bad = dict(m.fsdp_step, passes_s=[0.002, 0.003])  # less than the 3 ms of hooks
    with pytest.raises(UserError, match="could not be told apart"):
        fsdp_fit(m.with_(fsdp_step=bad))


def test_fsdp_profile_header_says_what_was_scaled(tmp_path):
    from oresearcher.hardware import load_profile_file

    write_profile(tmp_path / "p.yaml", _fsdp_record(), "cpu-cal", "gloo-cal", jitter=False)
    text = (tmp_path / "p.yaml").read_text()
    assert "# fsdp step, the program's own" in text and "-> copies x 2.000" in text and "optimizer x 1.400" in text
    assert "# passes: the" not in text  # the program's FLOP ops hold its collectives: not a pass rate
    dev, _ = load_profile_file(tmp_path / "p.yaml")
    assert dev.memory_bandwidth_GBps == pytest.approx(5.0) and dev.pass_flops_per_s == pytest.approx(6e8 / 0.019)


def test_schedule_groups_by_hand():
    """What the CPU schedule charges per step, by group, from the constants: llama-tiny's
    plan (a root unit and 4 blocks), ZeRO-3 (blocks 1-3 gathered again for backward)."""
    from oresearcher.backends.calibration.fsdp_inrun import schedule_groups
    from oresearcher.scenario import load_scenario
    from oresearcher.models.sharding import scenario_plan

    sc = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "cpu-fsdp.yaml", ["agents.count=2"])
    plan = scenario_plan(sc)
    root, blocks = len(plan.root.shapes), [len(b.shapes) for b in plan.blocks]
    params = root + sum(blocks)
    local = sum(u.padded_numel(2) // 2 for u in plan.units)
    costs = dict(copy_Bps=1e30, dtensor_param_step_s=1e-4, optimizer_element_s=4e-9, gather_param_s=3e-5,
                 reduce_param_s=2e-5, unit_step_s=6e-4)
    g = schedule_groups(sc, 2, costs)
    gathered = root + sum(blocks) + sum(blocks[:-1])  # forward: every unit; backward: the resharded blocks
    assert g["copies_s"] == pytest.approx(gathered * 3e-5 + params * 2e-5)  # no bytes at infinite bandwidth
    assert g["optimizer_s"] == pytest.approx(params * 1e-4 + local * 4e-9)
    assert g["hooks_s"] == pytest.approx((1 + len(blocks)) * 6e-4)
    assert g["pass_flops"] == pytest.approx(plan.root.fwd_flops + plan.root.bwd_flops
                                            + sum(b.fwd_flops + b.bwd_flops for b in plan.blocks))
    # the bytes go as one over the bandwidth
    slow = schedule_groups(sc, 2, dict(costs, copy_Bps=1e9, gather_param_s=0.0, reduce_param_s=0.0))
    slower = schedule_groups(sc, 2, dict(costs, copy_Bps=5e8, gather_param_s=0.0, reduce_param_s=0.0))
    assert slower["copies_s"] == pytest.approx(2 * slow["copies_s"]) and slow["copies_s"] > 0


def test_every_module_imports_outside_the_checkout(tmp_path):
    """The installed package works from any directory: no module imports the checkout's
    top-level folders (sim/, backends/) by their folder names, which only resolve when
    the working directory is the repository root."""
    import os
    import subprocess
    import sys

    code = ("import importlib, pkgutil, oresearcher\n"
            "for m in pkgutil.walk_packages(oresearcher.__path__, 'oresearcher.'):\n"
            "    if not m.name.endswith('__main__'):\n"
            "        importlib.import_module(m.name)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


def test_write_profile_takes_the_simulated_waiting_off_the_in_run_rows(tmp_path):
    """With jitter the simulator draws the ranks' waiting and waking at the program's own
    collectives, so the in-run rows the fabric is scaled to keep the transfer alone: the
    in-run factor is the rows' times less the wake fit's floor over the sweep's fit."""
    from oresearcher.calibration.fabric_fit import fit_fabric, inrun_factor
    from oresearcher.calibration.profiles import wake_fit
    from oresearcher.hardware import load_profile_file

    inrun = [{"kind": "AllReduce", "bytes": 2**20, "time_s": 0.02, "count": 20, "workload": True, "in_run": True}]
    waits = [{"kind": "AllReduce", "flops": [2e9], "steps": [s], "wait_s": 0.015} for s in range(20)]
    m = record(step_seconds_per_rank=[[0.09, 0.11] * 10, [0.11, 0.09] * 10], compute_step_s_mean=0.1,
               op_flops=[[2e9]] * 20, inrun_collectives=inrun, arrival_waits=waits)
    wake, floor = wake_fit(m)
    assert wake > 0 and 0 < floor < 0.02
    write_profile(tmp_path / "p.yaml", m, "cpu-cal", "gloo-cal", jitter=True)
    dev, _ = load_profile_file(tmp_path / "p.yaml")
    assert dev.wake_delay_us == pytest.approx(wake * 1e6)
    text = (tmp_path / "p.yaml").read_text()
    sweep = fit_fabric(m.collectives, 2, m.call_overhead_s)
    want = inrun_factor([dict(inrun[0], time_s=0.02 - floor)], 2, sweep)
    assert f"in-run collectives: {want:.3f} x" in text
    assert f"in-run collectives: {inrun_factor(inrun, 2, sweep):.3f} x" not in text  # not the rows as measured
    # without jitter nothing is drawn: no delay, the rows as measured
    write_profile(tmp_path / "q.yaml", m, "cpu-cal", "gloo-cal", jitter=False)
    assert load_profile_file(tmp_path / "q.yaml")[0].wake_delay_us == 0.0
    assert f"in-run collectives: {inrun_factor(inrun, 2, sweep):.3f} x" in (tmp_path / "q.yaml").read_text()
