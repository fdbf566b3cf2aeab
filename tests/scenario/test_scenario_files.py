"""Default scenarios are found from any directory; the user's own file always wins."""
from pathlib import Path

from oresearcher.errors import cli_main
from oresearcher.scenario.shipped import find_scenario, shipped_scenarios
from oresearcher.sim.__main__ import main as sim_main


def test_shipped_scenarios_found_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert {"8xA100", "local-gloo", "cpu-tiny"} <= set(shipped_scenarios())
    for name in ("scenarios/8xA100.yaml", "8xA100.yaml", "8xA100"):
        found = find_scenario(name)
        assert found.is_file() and found.name == "8xA100.yaml"
    assert find_scenario("elsewhere/8xA100.yaml") == Path("elsewhere/8xA100.yaml")  # a path elsewhere: as given
    assert find_scenario("nope.yaml") == Path("nope.yaml")


def test_a_local_file_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "8xA100.yaml").write_text("name: mine\n")
    assert find_scenario("scenarios/8xA100.yaml") == Path("scenarios/8xA100.yaml")


def test_simulator_runs_from_another_directory_and_names_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli_main(sim_main, ["scenarios/cpu-tiny.yaml", "--set", "training.steps=2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "scenario file:" in out and "cpu-tiny.yaml" in out
    assert (tmp_path / "runs" / "cpu-tiny" / "report.json").is_file()
