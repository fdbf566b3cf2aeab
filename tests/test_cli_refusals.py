"""No silent success: a flag the run would ignore, flags that contradict each other, a
cluster whose size the agents do not follow. Each is refused through the command line in
one line on stderr with exit code 2, before anything starts or is written.

The CLIs' main() run in process; `run`'s rank launch is replaced by a stub that fails the
test if it is ever reached."""
from __future__ import annotations

import pytest

from oresearcher.errors import cli_main
from oresearcher.run import main as run_main

TINY = ("name: t\ncluster: {nodes: 1, gpus_per_node: 4, device: cpu-local, intra_node: loopback}\n"
        "workload: {task: digits, model: mlp, global_batch: 32, dtype: fp32}\nagents: {count: 2}\n"
        "training: {strategy: STRATEGY, steps: 4, lr: 0.1}\n")


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run a CLI main(); returns (exit code, stdout, stderr lines)."""
    from oresearcher.backends import launcher

    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(k, raising=False)

    def never(*a, **k):
        raise AssertionError("a rank was about to start")

    monkeypatch.setattr(launcher, "launch_local", never)

    def call(main, argv):
        code = cli_main(main, argv)
        out = capsys.readouterr()
        return code, out.out, out.err.strip().splitlines()
    return call


def scenario(tmp_path, strategy="ddp", extra=""):
    path = tmp_path / f"{strategy}.yaml"
    path.write_text(TINY.replace("STRATEGY", strategy) + extra)
    return str(path)


def one_line(code, err, *words):
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    for w in words:
        assert w in err[0], err[0]


# ---- a flag the chosen strategy ignores --------------------------------------------------
@pytest.mark.parametrize("strategy, flags, users", [
    ("ddp", ["--communication_interval=100"], "oresearcher"),
    ("ddp", ["--reward_weights=0.5,0.3,0.2"], "oresearcher"),
    ("ddp", ["--local_steps=5"], "local_sgd or diloco"),
    ("oresearcher", ["--local_steps=5"], "local_sgd or diloco"),
    ("local_sgd", ["--codec=int8"], "oresearcher or ddp"),
    ("local_sgd", ["--reward_weights=1,0,0"], "oresearcher"),
    ("single", ["--communication_interval=7"], "oresearcher"),
])
def test_a_flag_the_strategy_ignores_is_refused_naming_who_uses_it(strategy, flags, users, tmp_path, cli):
    out = tmp_path / "o"
    code, _, err = cli(run_main, ["--scenario", scenario(tmp_path, strategy), "--out", str(out), *flags])
    flag = flags[0].split("=")[0]
    one_line(code, err, flag, f"training.strategy {strategy} does not use", f"used by {users}")
    assert not out.exists()


def test_the_design_documents_command_is_refused_not_run_as_ddp(tmp_path, cli):
    """The command of the design document, on a ddp scenario: the interval and the reward
    weights were saved and never used; now the first of them is named."""
    code, _, err = cli(run_main, ["--backend=gloo", "--scenario", scenario(tmp_path), "--out", str(tmp_path / "o"),
                                  "--num_agents=4", "--communication_interval=100", "--reward_weights=0.5,0.3,0.2"])
    one_line(code, err, "--communication_interval", "--strategy=oresearcher")


def test_the_flags_a_strategy_uses_pass_the_check(tmp_path, cli, monkeypatch):
    """The same flags with the strategy that reads them get past every check to the launch
    (the stub stops it there)."""
    from oresearcher import run

    reached = []
    monkeypatch.setattr(run, "_launch", lambda scenario, *a: reached.append(scenario) or 0)
    for strategy, flags in [("oresearcher", ["--communication_interval=3", "--reward_weights=0.5,0.3,0.2"]),
                            ("local_sgd", ["--local_steps=2"]), ("ddp", ["--codec=int8"])]:
        code, _, err = cli(run_main, ["--scenario", scenario(tmp_path, strategy), "--out", str(tmp_path / strategy),
                                      *flags])
        assert code == 0, err
    sc = reached[0]
    assert sc.communication.interval == 3 and tuple(sc.agents.reward_weights) == (0.5, 0.3, 0.2)
    assert reached[1].training.local_steps == 2 and str(reached[2].communication.codec) == "int8"


def test_fusion_interval_of_sharded_training_needs_sharded_agents(tmp_path, cli):
    fsdp = ("name: f\ncluster: {nodes: 1, gpus_per_node: 4, device: cpu-local, intra_node: loopback}\n"
            "workload: {task: synthetic-lm, model: gpt-tiny, global_batch: 8, seq_len: 16, dtype: fp32}\n"
            "agents: {count: 4}\ntraining: {strategy: fsdp, steps: 2}\n")
    path = tmp_path / "f.yaml"
    path.write_text(fsdp)
    code, _, err = cli(run_main, ["--scenario", str(path), "--out", str(tmp_path / "o"), "--communication_interval=5"])
    one_line(code, err, "fsdp with fsdp.replicas=fusion")


# ---- flags that contradict each other ------------------------------------------------------
@pytest.mark.parametrize("flags, words", [
    (["--resume-step", "3"], "--resume-step only applies to --resume"),
    (["--override"], "--override only applies to --resume"),
    (["--strategy=ddp", "--set", "training.strategy=local_sgd"], "both set training.strategy"),
    (["--steps=5", "--set", "training.steps=6"], "both set training.steps"),
    (["--num_agents=2", "--set", "agents.count=4"], "both set agents.count"),
])
def test_contradicting_flags_are_one_line(flags, words, tmp_path, cli):
    out = tmp_path / "o"
    code, _, err = cli(run_main, ["--scenario", scenario(tmp_path), "--out", str(out), *flags])
    one_line(code, err, words)
    assert not out.exists()
