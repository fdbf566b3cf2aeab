"""`python -m oresearcher.sim` on inputs users type: each is one clear line and exit 2, or
the right result; nothing outside --out changes and no link there is followed."""
import json

import pytest

from oresearcher.errors import cli_main
from oresearcher.sim.__main__ import main

S = ["scenarios/cpu-tiny.yaml", "--set", "training.steps=2"]
# data parallel is the law's own regime: a convergence section without proxy training
DDP = [*S, "--set", "training.strategy=ddp", "--target-loss", "10"]


def run(argv, capsys):
    code = cli_main(main, argv)
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


REFUSED = {
    "context": ([*S, "--set", "workload.seq_len=257"], "--set workload.seq_len=257: workload: seq_len=257 is longer "
                                                        "than gpt-tiny's context of 256"),
    "context 8xA100": (["scenarios/8xA100.yaml", "--set", "workload.seq_len=4096"], "context of 2048"),
    "context in a sweep": ([*S, "--sweep", "workload.seq_len=64,257"], "context of 256"),
    "empty sweep": ([*S, "--sweep", "communication.bucket_size_MB=[]"], "no values to sweep"),
    "target twice": ([*S, "--target-loss", "10", "--set", "convergence.target_loss=20"],
                     "--target-loss 10 and --set convergence.target_loss=20 both set"),
    "target swept": ([*S, "--target-loss", "10", "--sweep", "convergence.target_loss=20,30"],
                     "--target-loss 10 and --sweep convergence.target_loss=... both set"),
    "target in a mapping": ([*S, "--target-loss", "10", "--set", "convergence={target_loss: 3}"], "both set"),
    "target with bench": ([*S, "--collective-bench", "all_reduce", "--target-loss", "3"],
                          "--target-loss applies to a simulated training run"),
    "target zero": ([*S, "--target-loss=0"], "--target-loss 0: expected a loss"),
    "target nan": ([*S, "--target-loss=nan"], "--target-loss nan"),
    "fabric by --set": ([*S, "--set", "cluster.intra_node=nosuch"], "error: --set cluster.intra_node=nosuch: "
                                                                    "cluster.intra_node: unknown fabric"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused_in_one_line(case, tmp_path, capsys):
    argv, words = REFUSED[case]
    code, out, err = run([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())  # refused before any output


@pytest.mark.parametrize("beta", ["0.001", "1e-300"])
def test_a_tiny_law_beta_is_never_reached_not_an_overflow(beta, tmp_path, capsys):
    code, out, err = run([*DDP, "--set", f"convergence.law.beta={beta}", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    c = json.loads((tmp_path / "report.json").read_text())["convergence"]
    assert c["to_target"]["steps"] is None and "1e300 tokens" in c["to_target"]["why"]


@pytest.mark.parametrize("source", ["[/x]", "[bold]x", "[link=file:///etc]y[/link]"])
def test_user_text_prints_literally(source, tmp_path, capsys):
    code, out, err = run([*DDP, "--set", f"convergence.law.source='{source}'", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert f"convergence, base run: {source}" in out


def test_a_prediction_never_replaces_a_measured_run(tmp_path, capsys):
    real = tmp_path / "r"
    real.mkdir()
    (real / "run.json").write_text('{"run_id": "x", "scenarios": []}')
    (real / "report.json").write_text('{"backend": "gloo"}')
    code, _, err = run([*S, "--out", str(real)], capsys)
    assert code == 2 and "holds a real run (run.json)" in err[0]
    (real / "run.json").unlink()
    code, _, err = run([*S, "--out", str(real)], capsys)
    assert code == 2 and "holds a measured report (backend gloo)" in err[0]
    assert (real / "report.json").read_text() == '{"backend": "gloo"}' and len(list(real.iterdir())) == 1
    assert run([*S, "--out", str(tmp_path / "p")], capsys)[0] == 0
    assert run([*S, "--out", str(tmp_path / "p")], capsys)[0] == 0  # a prediction over a prediction: fine


def test_links_planted_in_out_are_replaced_never_followed(tmp_path, capsys):
    user = tmp_path / "user.txt"
    user.write_text("mine\n")
    out = tmp_path / "o"
    out.mkdir()
    names = ("report.json", "trace.json", "timeline.png", "breakdown.png", "summary.png", "convergence.png")
    for name in names:
        (out / name).symlink_to(user)
    code, _, err = run([*DDP, "--out", str(out)], capsys)
    assert code == 0, err
    assert user.read_text() == "mine\n"
    assert all((out / n).is_file() and not (out / n).is_symlink() for n in names)


def test_a_per_rank_engine_past_1024_ranks_says_so_first():
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.cli_checks import per_rank_note

    big = load_scenario("scenarios/128x8xA100.yaml", ["cluster.nodes=256", "agents.count=2048",
                                                      "training.strategy=oresearcher"])
    assert "2,048 ranks, one simulated process each (training.strategy oresearcher)" in per_rank_note(big, "shape", False)
    ddp = load_scenario("scenarios/128x8xA100.yaml", ["cluster.nodes=256", "agents.count=2048",
                                                      "training.strategy=ddp"])
    assert per_rank_note(ddp, "shape", False) is None
    assert "--exact" in per_rank_note(ddp, "shape", True)
