"""`python -m oresearcher.sim`: every scenario runs; every bad input is one line and exit 2."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from oresearcher.errors import cli_main
from oresearcher.sim.__main__ import main

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.yaml"))
assert SCENARIOS, "no scenario files found next to the tests"


def run(argv, capsys):
    code = cli_main(main, argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_scenario_file_runs(path, tmp_path, capsys):
    code, out, err = run([str(path), "--out", str(tmp_path), "--set", "training.steps=2"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    for key in ("step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s",
                "comm_overhead", "wire_bytes_per_step", "scenario"):
        assert key in report
    assert report["step_time_s"] > 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    assert (tmp_path / "timeline.png").stat().st_size > 1000


def test_reference_report_states_exposed_and_total_comm(tmp_path, capsys):
    code, out, _ = run(["scenarios/8xA100.yaml", "--out", str(tmp_path), "--set", "training.steps=3"], capsys)
    assert code == 0
    assert "exposed communication time" in out and "communication time (in flight)" in out
    r = json.loads((tmp_path / "report.json").read_text())
    assert 0 <= r["exposed_comm_time_s"] <= r["comm_time_s"]
    assert r["comm_overhead"] == pytest.approx(r["exposed_comm_time_s"] / r["step_time_s"])
    assert r["scenario"]["communication"]["interval"] == 100


def _write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


BASE = "cluster: {nodes: 1, gpus_per_node: 4, device: cpu-local, intra_node: loopback}\nagents: {count: 4}\n"


@pytest.mark.parametrize("text,needle", [
    ("cluster: {nodes: 1\n", "YAML syntax error"),
    (BASE + "bogus: 1\n", "bogus"),
    (BASE + "training: {steps: many}\n", "training.steps"),
    ("cluster: {gpus_per_node: 0, device: cpu-local, intra_node: loopback}\nagents: {count: 1}\n", "cluster.gpus_per_node"),
    (BASE.replace("count: 4", "count: 9"), "agents"),
    (BASE.replace("cpu-local", "Z80"), "cluster.device"),
    (BASE.replace("loopback", "carrier-pigeon"), "cluster.intra_node"),
    (BASE + "communication: {codec: int9}\n", "communication.codec"),
    (BASE + "workload: {model: gpt-9000}\n", "workload.model"),
])
def test_bad_scenarios_give_one_line_and_exit_2(tmp_path, capsys, text, needle):
    path = _write(tmp_path, text)
    code, out, err = run([path, "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err
    assert path in err or "s.yaml" in err


def test_negative_bandwidth_in_a_profile_file_is_rejected(tmp_path, capsys):
    _write(tmp_path, "kind: fabric\nname: bad\ntopology: switch\nbandwidth_GBps: -5\nefficiency: 1\n"
           "base_latency_us: 1\nhop_latency_us: 1\ncall_overhead_us: 1\n", "prof.yaml")
    path = _write(tmp_path, BASE.replace("loopback", "bad").replace("}\nagents", ", profile_files: [prof.yaml]}\nagents"))
    code, _, err = run([path], capsys)
    assert code == 2 and "bandwidth_GBps" in err and "-5" in err


def test_missing_file_and_bad_override(tmp_path, capsys):
    code, _, err = run([str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "no such file" in err
    code, _, err = run(["scenarios/cpu-tiny.yaml", "--set", "communication.bucket_size_MB=-1"], capsys)
    assert code == 2 and "communication.bucket_size_MB" in err and "-1" in err


def test_sweep_writes_table_and_plot(tmp_path, capsys):
    code, out, err = run(["scenarios/cpu-tiny.yaml", "--out", str(tmp_path), "--set", "training.steps=2",
                          "--sweep", "communication.bucket_size_MB=0.1,1,10"], capsys)
    assert code == 0, err
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert sweep["values"] == [0.1, 1, 10] and len(sweep["results"]) == 3
    assert (tmp_path / "sweep.png").exists()
    lines = out.splitlines()
    assert lines[0].strip(), "the table starts at the first line"
    assert max(len(line) for line in lines) <= 80 and "…" not in out  # nothing cut at 80 columns
    assert "step ms" in out and "exposed ms" in out


def test_every_run_dir_gets_a_summary_page(tmp_path, capsys):
    code, _, err = run(["scenarios/cpu-tiny.yaml", "--out", str(tmp_path), "--set", "training.steps=2"], capsys)
    assert code == 0, err
    for name in ("summary.png", "timeline.png", "breakdown.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_collective_bench_table(tmp_path, capsys):
    code, out, _ = run(["scenarios/8xA100.yaml", "--out", str(tmp_path), "--collective-bench", "all_reduce"], capsys)
    assert code == 0
    rows = json.loads((tmp_path / "collective_bench_all_reduce.json").read_text())["rows"]
    assert rows[0]["size_bytes"] == 8 and rows[-1]["size_bytes"] == 8 * 2**30
    for r in rows:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 7 / 8)


def test_module_entry_point_exit_code(tmp_path):
    p = subprocess.run([sys.executable, "-m", "oresearcher.sim", str(tmp_path / "missing.yaml")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
