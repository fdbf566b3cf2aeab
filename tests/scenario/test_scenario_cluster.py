"""cluster.device and the fabric names are checked against the profiles at load time:
the built-in ones and those in cluster.profile_files (relative to the scenario)."""
import pytest

from oresearcher.errors import UserError
from oresearcher.scenario import load_scenario

BASE = ("cluster: {nodes: 1, gpus_per_node: 2, device: DEV, intra_node: FAB, profile_files: FILES}\n"
        "workload: {task: digits, model: mlp, global_batch: 8, dtype: fp32}\nagents: {count: 2}\n")
PROFILE = """kind: device
name: cpu-calibrated
peak_flops: {fp32: 1.0e+10}
efficiency: 1.0
memory_bytes: 1.0e+9
host_overhead_us: 10
---
kind: fabric
name: gloo-calibrated
topology: switch
bandwidth_GBps: 1.0
efficiency: 1.0
base_latency_us: 10
hop_latency_us: 5
call_overhead_us: 1
"""


def scenario(tmp_path, dev="cpu-calibrated", fab="gloo-calibrated", files="[prof.yaml]"):
    p = tmp_path / "s.yaml"
    p.write_text(BASE.replace("DEV", dev).replace("FAB", fab).replace("FILES", files))
    return p


def test_names_from_a_profile_file_are_known(tmp_path):
    (tmp_path / "prof.yaml").write_text(PROFILE)
    sc = load_scenario(scenario(tmp_path))
    assert (sc.cluster.device, sc.cluster.intra_node) == ("cpu-calibrated", "gloo-calibrated")
    with pytest.raises(UserError, match=r"cluster.device: unknown device profile 'cpu-calibratd' \(known: .*"
                                        r"cpu-calibrated, cpu-local\)"):
        load_scenario(scenario(tmp_path, dev="cpu-calibratd"))
    with pytest.raises(UserError, match="cluster.intra_node: unknown fabric profile 'gloo' .*gloo-calibrated"):
        load_scenario(scenario(tmp_path, fab="gloo"))


def test_a_missing_profile_file_leaves_its_names_unjudged(tmp_path):
    """A run's saved copy keeps relative profile paths; the simulator reports the missing file."""
    load_scenario(scenario(tmp_path))  # prof.yaml is not there: cpu-calibrated may be in it
    with pytest.raises(UserError, match="unknown fabric profile 'loopbak'"):  # no file missing: judged
        load_scenario(scenario(tmp_path, dev="cpu-local", fab="loopbak", files="[]"))



def test_load_time_and_the_simulator_build_one_catalogue(tmp_path):
    """The load-time check and the simulator read profiles through one function: the same
    paths (relative to the scenario, or absolute), the same refusals; only a missing file
    is tolerated at load time."""
    from oresearcher.hardware import catalogue

    (tmp_path / "prof.yaml").write_text(PROFILE)
    files = ["prof.yaml", str(tmp_path / "later.yaml")]
    assert ("device", "cpu-calibrated") in catalogue(files, tmp_path, missing_ok=True)
    with pytest.raises(UserError, match="later.yaml: no such profile file"):
        catalogue(files, tmp_path)
    (tmp_path / "later.yaml").write_text(PROFILE.split("---")[0].replace("cpu-calibrated", "cpu-later"))
    assert catalogue(files, tmp_path, missing_ok=True) == catalogue(files, tmp_path)
    (tmp_path / "prof.yaml").write_text(PROFILE.replace("cpu-calibrated", "cpu-local"))  # a shipped name
    with pytest.raises(UserError, match="'cpu-local' is the name of a shipped profile"):
        load_scenario(scenario(tmp_path, dev="cpu-local"))
