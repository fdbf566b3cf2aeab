"""The scenario is parsed once per run: the command reads, overrides and validates the
YAML, and the ranks its launcher starts rebuild the validated scenario from what it hands
down (backends/run/flags.py: hand_down, handed_down) without reading a file."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bk_helpers import REPO, write_scenario
from oresearcher.backends.run.flags import HANDED_DOWN, hand_down, handed_down
from oresearcher.backends.run.launcher import DistEnv
from oresearcher.scenario import load_scenario

LAUNCHED = DistEnv(1, 2, 1, "127.0.0.1", 1, store_host="launcher")
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))

# put first on the ranks' PYTHONPATH: logs every YAML read and every validation, per process
COUNTER = '''
import os
from oresearcher import yamlsafe
from oresearcher.scenario import load

_read, _validate = yamlsafe.read, load.validate


def _log(what):
    with open(os.environ["BK_PARSE_LOG"], "a") as f:
        f.write(os.environ.get("RANK", "launcher") + " " + what + "\\n")


def read(path, *a, **k):
    _log("read " + os.path.basename(str(path)))
    return _read(path, *a, **k)


def validate(*a, **k):
    _log("validate")
    return _validate(*a, **k)


yamlsafe.read, load.validate = read, validate
'''


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_a_handed_down_scenario_is_the_parsed_one(path, monkeypatch):
    """Every shipped scenario comes back equal (its fields and the file it came from, which
    relative paths resolve against), and rebuilding it reads no file."""
    scenario = load_scenario(path, ["training.steps=7"])
    env = hand_down(scenario)

    def no_file(*a, **k):
        raise AssertionError("a handed-down scenario read a file")

    monkeypatch.setattr("oresearcher.yamlsafe.read", no_file)
    got = handed_down(LAUNCHED, env)
    assert got == scenario and got.resolved() == scenario.resolved() and got.training.steps == 7
    assert got._source == scenario._source


def test_only_a_rank_of_our_launcher_takes_it():
    """torchrun's ranks (no launcher of ours) and the command itself parse the file."""
    env = hand_down(load_scenario(SHIPPED[0]))
    assert handed_down(None, env) is None
    assert handed_down(DistEnv(1, 2, 1, "h", 1, store_host="agent"), env) is None
    assert handed_down(DistEnv(1, 2, 1, "h", 1, store_host="rank0"), env) is None
    assert handed_down(LAUNCHED, {}) is None
    assert HANDED_DOWN in env


def test_a_stale_scenario_is_not_handed_on(monkeypatch):
    """The ranks get this command's scenario; one left in the command's own environment
    is dropped, also when this one is too large to hand down."""
    from oresearcher.backends.run import flags

    old, new = load_scenario(SHIPPED[0]), load_scenario(SHIPPED[0], ["training.steps=9"])
    stale = hand_down(old, {"KEEP": "1"})
    env = hand_down(new, stale)
    assert env["KEEP"] == "1" and handed_down(LAUNCHED, env).training.steps == 9
    monkeypatch.setattr(flags, "HANDED_DOWN_MAX", 10)
    assert handed_down(LAUNCHED, hand_down(new, stale)) is None


def test_a_gloo_run_of_two_ranks_parses_its_scenario_once(tmp_path, child_env):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTER)
    log = tmp_path / "parses.log"
    sc = write_scenario(tmp_path / "s.yaml", training={"steps": 2, "checkpoint_every": 0})
    env = dict(child_env, BK_PARSE_LOG=str(log), PYTHONPATH=f"{hook}:{child_env['PYTHONPATH']}")
    p = subprocess.run([sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--scenario", str(sc),
                        "--out", str(tmp_path / "run"), "--no-tensorboard", "--log-level", "WARNING"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = log.read_text().splitlines()
    parses = [line for line in lines if line.endswith((" validate", " read s.yaml"))]
    assert "launcher read s.yaml" in parses and parses.count("launcher validate") == 1  # the command: once
    assert [line for line in parses if not line.startswith("launcher ")] == []  # each rank: none (was 2 reads, 1 validation)
    assert (tmp_path / "run" / "report.json").is_file()
