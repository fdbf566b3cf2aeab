"""gloo, 2 ranks: `oresearcher.calibrate` on the cpu-fsdp model measures what the fsdp
schedule's host costs need (backends/calibration/fsdp.py) and the simulator loads them.
The sweeps reach 1 MiB: up to a few KiB alone, a loaded host's milliseconds can put the
fitted bandwidth below what a profile may hold."""
from __future__ import annotations

import subprocess
import sys

from bk_helpers import REPO


def test_calibrate_measures_the_fsdp_host_costs(tmp_path, child_env):
    from oresearcher.programs.fsdp_costs import HostCosts
    from oresearcher.scenario import load_scenario
    from oresearcher.hardware import load_profile_file
    from oresearcher.sim.simulate import simulate

    prof = tmp_path / "p.yaml"
    sets = ["--set", "agents.count=2", "--set", "workload.global_batch=4", "--set", "training.strategy=ddp"]
    p = subprocess.run([sys.executable, "-m", "oresearcher.calibrate", "--scenario", "scenarios/cpu-fsdp.yaml", *sets,
                        "--out", str(prof), "--max-bytes", "2e6", "--repeats", "1", "--compute-steps", "2"],
                       cwd=REPO, env=child_env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    dev = load_profile_file(prof)[0]
    # a DTensor's step always costs more host time than a plain tensor's (its Python
    # dispatch of every elementwise op); copies and the plain step take some time
    assert dev.dtensor_param_step_us > 0 and dev.optimizer_element_ns > 0 and dev.memory_bandwidth_GBps > 0
    # FSDP2's Python around each collective takes some time per parameter
    assert dev.fsdp_gather_param_us > 0 and dev.fsdp_reduce_param_us > 0 and dev.fsdp_unit_step_us > 0
    # the passes alone run faster than the whole ddp program's compute (packing, optimizer)
    assert dev.pass_flops_per_s > dev.flops_per_s("fp32")
    text = prof.read_text()
    assert "# passes:" in text and "# fsdp host costs" in text and "# fsdp bookkeeping" in text
    sc = load_scenario(REPO / "scenarios/cpu-fsdp.yaml", ["agents.count=2", "workload.global_batch=4",
                                                          "training.steps=2", f"cluster.profile_files=[{prof}]",
                                                          "cluster.device=cpu-calibrated",
                                                          "cluster.intra_node=gloo-calibrated"])
    report, _ = simulate(sc)
    costs = HostCosts.of(dev, "fp32")
    assert report["step_time_s"] > 0 and costs.pass_rate == dev.pass_flops_per_s and not costs.streams


def test_calibrate_on_the_fsdp_program_times_its_own_step(tmp_path, child_env):
    """Calibrating the fsdp scenario itself: FSDP2's collectives, timed inside the step,
    are the in-run rows the fabric is scaled to, and the constants are scaled to the
    step's own pieces (backends/calibration/fsdp_inrun.py)."""
    from oresearcher.hardware import load_profile_file

    prof = tmp_path / "p.yaml"
    sets = ["--set", "agents.count=2", "--set", "workload.global_batch=4"]
    p = subprocess.run([sys.executable, "-m", "oresearcher.calibrate", "--scenario", "scenarios/cpu-fsdp.yaml", *sets,
                        "--out", str(prof), "--max-bytes", "2e6", "--repeats", "1", "--compute-steps", "2"],
                       cwd=REPO, env=child_env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    text = prof.read_text()
    assert "# fsdp step, the program's own" in text and "# passes: the" not in text
    # FSDP2's per-block all-gathers and (gloo) its reduce-scatters as all-reduces of the whole input
    rows = [line.split() for line in text.splitlines() if "**" in line and line.startswith("#   ")]
    assert {r[1] for r in rows} == {"AllGather**", "AllReduce**"}
    assert "in-run collectives: 1.000 x" not in text  # the fabric was scaled to them
    dev = load_profile_file(prof)[0]
    assert dev.flops_per_s("fp32") == dev.pass_flops_per_s > 0
    assert dev.memory_bandwidth_GBps > 0 and dev.dtensor_param_step_us > 0
