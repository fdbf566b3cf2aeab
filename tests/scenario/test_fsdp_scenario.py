"""fsdp scenario fields and flags: defaults, ranges, and one-line errors (exit 2)."""
from __future__ import annotations

import json

import pytest

from oresearcher.errors import UserError, cli_main
from oresearcher.run import main as run_main
from oresearcher.scenario import load_scenario
from oresearcher.sim.__main__ import main as sim_main

CPU = "scenarios/cpu-fsdp.yaml"


def test_defaults_are_zero3_over_every_rank():
    sc = load_scenario(CPU)
    assert sc.training.strategy == "fsdp" and sc.fsdp.reshard_after_forward
    assert sc.fsdp.group_size(sc.world_size) == 4 and sc.fsdp.reduce_dtype == "compute"
    assert load_scenario(CPU, ["fsdp.shard_group_size=2"]).fsdp.group_size(4) == 2


@pytest.mark.parametrize("override,words", [
    ("fsdp.shard_group_size=3", "does not divide agents.count=4"),
    ("fsdp.shard_group_size=-1", "fsdp.shard_group_size"),
    ("fsdp.shard_group_size=true", "not true/false"),
    ("fsdp.reduce_dtype=fp8", "fsdp.reduce_dtype"),
    ("fsdp.zero_stage=3", "fsdp.zero_stage"),
    ("simulation.mode=numeric", "shape mode"),
    ("training.strategy=colossalai", "maps to fsdp"),
    ("fsdp.replicas=fusion", "needs more than one sharded agent"),
    ("fsdp.replicas=average", "fsdp.replicas"),
])
def test_bad_fields_name_the_field(override, words):
    with pytest.raises(UserError) as e:
        load_scenario(CPU, [override])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_fsdp_needs_a_transformer_task():
    with pytest.raises(UserError, match="needs workload.task synthetic-lm"):
        load_scenario("scenarios/digits-4.yaml", ["training.strategy=fsdp"])


@pytest.mark.parametrize("main,argv", [
    (run_main, ["--strategy=colossalai"]),
    (run_main, ["--scenario", CPU, "--strategy", "ColossalAI"]),
])
def test_colossalai_answers_in_one_line(main, argv, capsys, tmp_path):
    code = cli_main(main, [*argv, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "maps to fsdp" in err and "torch <= 2.5.1" in err and "--strategy=fsdp" in err
    assert not (tmp_path / "run").exists()


def test_sim_cli_reports_sharded_memory(tmp_path, capsys):
    code = cli_main(sim_main, [CPU, "--out", str(tmp_path), "--set", "training.steps=2"])
    out = capsys.readouterr().out
    assert code == 0 and "memory per GPU" in out and "fits" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert {"fsdp_all_gather", "fsdp_reduce_scatter"} <= {row["name"] for row in report["breakdown"]}
    assert report["memory"]["sharded_params"] == pytest.approx(4 * 803_968 / 4, abs=64)
