"""No silent success: a flag the run would ignore, flags that contradict each other, a
cluster whose size the agents do not follow. Each is refused through the command line in
one line on stderr with exit code 2, before anything starts or is written.

The CLIs' main() run in process; `run`'s rank launch is replaced by a stub that fails the
test if it is ever reached."""
from __future__ import annotations

from pathlib import Path

import pytest

from oresearcher.errors import cli_main
from oresearcher.run import main as run_main

TINY = ("name: t\ncluster: {nodes: 1, gpus_per_node: 4, device: cpu-local, intra_node: loopback}\n"
        "workload: {task: digits, model: mlp, global_batch: 32, dtype: fp32}\nagents: {count: 2}\n"
        "training: {strategy: STRATEGY, steps: 4, lr: 0.1}\n")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run a CLI main(); returns (exit code, stdout, stderr lines)."""
    from oresearcher.backends.run import launcher

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
    from oresearcher.backends.run import command as run

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


# ---- the simulator: a cluster the agents do not follow; flags that do nothing ----------------
def sim(cli, *argv):
    from oresearcher.sim.__main__ import main as sim_main

    return cli(sim_main, [str(a) for a in argv])


@pytest.mark.parametrize("scenario_file, sets, words", [
    # 16 agents would fill 2 of 128 nodes: the report would answer for 16 GPUs
    ("scenarios/2x8xA100.yaml", ["cluster.nodes=128"], ["--set cluster.nodes=128", "fills 2 of the cluster's 128",
                                                        "agents.count=1024"]),
    ("scenarios/2x8xA100.yaml", ["cluster.nodes=3"], ["--set cluster.nodes=3", "agents.count=24"]),
    # one node grown: the 8 agents would keep to 8 of its 16 GPUs
    ("scenarios/8xA100.yaml", ["cluster.gpus_per_node=16"], ["--set cluster.gpus_per_node=16",
                                                            "agents.count stays 8", "agents.count=16"]),
])
def test_a_cluster_the_agents_do_not_fill_is_refused(scenario_file, sets, words, tmp_path, cli):
    out = tmp_path / "o"
    code, _, err = sim(cli, scenario_file, "--out", out, *[x for s in sets for x in ("--set", s)])
    one_line(code, err, *words)
    assert scenario_file not in err[0]  # the --set made the mismatch, not the file
    assert not out.exists()


@pytest.mark.parametrize("strategy", ["ddp", "local_sgd", "diloco"])
def test_agents_of_different_architectures_under_one_model_are_refused_at_load(strategy, tmp_path, cli):
    """finance.yaml's agents differ in architecture; a strategy that trains one model on every
    rank is refused at load (it used to end in a collective mismatch, or gloo aborting)."""
    out = tmp_path / "o"
    code, _, err = sim(cli, "scenarios/finance.yaml", "--out", out, "--set", f"training.strategy={strategy}")
    one_line(code, err, f"--set training.strategy={strategy}", "agents.architectures:",
             f"training.strategy {strategy} trains one model on every rank", "oresearcher, single")
    assert not out.exists()


def test_a_file_whose_agents_leave_nodes_empty_is_refused(tmp_path, cli):
    path = tmp_path / "half.yaml"
    path.write_text((ROOT / "scenarios" / "2x8xA100.yaml").read_text().replace("count: 16", "count: 8"))
    code, _, err = sim(cli, path, "--out", tmp_path / "o")
    one_line(code, err, str(path), "agents.count=8 fills 1 of the cluster's 2 nodes")


def test_agents_set_on_purpose_with_the_cluster_pass(tmp_path, cli):
    """agents.count named beside the cluster's size: the one-node case keeps 4 agents on 8 GPUs."""
    code, _, err = sim(cli, "scenarios/cpu-tiny.yaml", "--out", tmp_path / "o", "--set", "cluster.gpus_per_node=8",
                       "--set", "agents.count=4", "--set", "training.steps=1")
    assert code == 0, err


def test_a_rounded_batch_is_printed(tmp_path, cli):
    """cpu-tiny's 4 agents with a batch of 6: each takes 1 (every task rounds down), 4 a step."""
    code, out, err = sim(cli, "scenarios/cpu-tiny.yaml", "--out", tmp_path / "o", "--set", "workload.global_batch=6",
                         "--set", "training.steps=1")
    assert code == 0, err
    assert "workload.global_batch 6 over 4 agents is 1 each: 4 a step (rounded down)" in out
    code, out, err = sim(cli, "scenarios/cpu-tiny.yaml", "--out", tmp_path / "p", "--set", "training.steps=1")
    assert code == 0 and "note: workload.global_batch" not in out  # 16 over 4 splits evenly


def test_the_shipped_1024_gpu_scenario_is_the_speed_benchmarks(tmp_path):
    """benchmarks/bench_sim_speed.py's 1,024-GPU case is this file, one agent per GPU."""
    from oresearcher.scenario import load_scenario

    sc = load_scenario("scenarios/128x8xA100.yaml")
    assert sc.cluster.world_size == sc.agents.count == 1024
    assert sc.workload.global_batch % sc.agents.count == 0
    assert '"scenarios/128x8xA100.yaml"' in (ROOT / "benchmarks" / "bench_sim_speed.py").read_text()


@pytest.mark.parametrize("flags, words", [
    (["--collective-bench", "allreduce"], "did you mean all_reduce?"),
    (["--collective-bench", "alltoall"], "did you mean all_to_all?"),
    (["--collective-bench", "all_reduce", "--sweep", "training.steps=1,2"], "--sweep and --collective-bench"),
    (["--collective-bench", "all_reduce", "--mode", "shape"], "--mode applies to a simulated training run"),
    (["--launch", "single-process"], "--launch only applies to --collective-bench"),
    (["--reference", "curve.csv"], "--reference only applies to --collective-bench"),
    (["--sweep", "training.steps=1,2", "--set", "training.steps=3"], "both set training.steps"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_sim_flags_that_would_do_nothing_are_one_line(flags, words, tmp_path, cli):
    out = tmp_path / "o"
    code, stdout, err = sim(cli, "scenarios/cpu-tiny.yaml", "--out", out, *flags)
    one_line(code, err, words)
    assert "usage:" not in stdout + " ".join(err) and not out.exists()


# ---- messages: did you mean, whose error, a directory ---------------------------------------
@pytest.mark.parametrize("text, words", [
    ("trainig: {steps: 2}\n", "trainig: Extra inputs are not permitted; did you mean training?"),
    ("training: {stpes: 2}\n", "did you mean training.steps?"),
    ("agents: {count: 2, roles: {explorr: 2}}\n", "did you mean agents.roles.explorer?"),
    ("communication: {bucket_size: 5}\n", "did you mean communication.bucket_size_MB?"),
])
def test_a_misspelt_key_in_a_file_gets_did_you_mean(text, words, tmp_path, cli):
    path = tmp_path / "typo.yaml"
    path.write_text(TINY.replace("STRATEGY", "ddp").replace("training: {strategy: ddp, steps: 4, lr: 0.1}\n", "")
                    .replace("agents: {count: 2}\n", "") + text)
    code, _, err = sim(cli, path, "--out", tmp_path / "o")
    one_line(code, err, str(path), words)


def test_a_far_off_key_gets_no_guess(tmp_path, cli):
    code, _, err = sim(cli, "scenarios/cpu-tiny.yaml", "--set", "zzzz=1")
    one_line(code, err, "zzzz: Extra inputs are not permitted")
    assert "did you mean" not in err[0]


@pytest.mark.parametrize("sets, words", [
    (["training.stpes=3"], "--set training.stpes=3: training.stpes: Extra inputs are not permitted; did you mean "
                           "training.steps?"),
    (["communication.bucket_size_MB=-1"], "--set communication.bucket_size_MB=-1: communication.bucket_size_MB"),
    (["training.steps=5", "training.steps.x=1"], "--set training.steps.x=1: "),
    (["agents.count=5"], "--set agents.count=5: agents.count=5 is more than the cluster's 4 GPUs"),  # across fields
])
def test_errors_a_set_made_name_the_set_not_the_file(sets, words, tmp_path, cli):
    code, _, err = sim(cli, "scenarios/cpu-tiny.yaml", "--out", tmp_path / "o", *[x for s in sets for x in ("--set", s)])
    one_line(code, err, words)
    assert "cpu-tiny.yaml" not in err[0]


def test_run_flag_errors_name_the_flag(tmp_path, cli):
    code, _, err = cli(run_main, ["--scenario", scenario(tmp_path), "--out", str(tmp_path / "o"), "--lr=100"])
    one_line(code, err, "--lr=100.0: training.lr")


def test_a_directory_given_as_scenario_says_so(tmp_path, cli):
    code, _, err = sim(cli, tmp_path)
    one_line(code, err, f"{tmp_path}: a directory, not a YAML file")
    code, _, err = cli(run_main, ["--scenario", str(tmp_path)])
    one_line(code, err, "a directory")


# ---- compare says what the prediction was priced with ---------------------------------------
def _compare_reports(tmp_path, cluster):
    import json

    base = {"step_time_s": 0.02, "compute_time_s": 0.015, "comm_time_s": 0.004, "exposed_comm_time_s": 0.005,
            "comm_overhead": 0.25, "wire_bytes_per_step": 3.4e6, "world_size": 2,
            "scenario": {"name": "local-gloo", "training": {"strategy": "ddp"}, "cluster": cluster}}
    pred, meas = tmp_path / "pred.json", tmp_path / "meas.json"
    pred.write_text(json.dumps(dict(base, backend="sim")))
    meas.write_text(json.dumps(dict(base, backend="gloo", step_time_s=0.035)))
    return str(pred), str(meas)


def test_compare_names_the_default_profiles_and_how_to_calibrate(tmp_path, cli):
    from oresearcher.compare import main as compare_main

    pred, meas = _compare_reports(tmp_path, {"device": "cpu-local", "intra_node": "loopback", "profile_files": []})
    code, out, err = cli(compare_main, [pred, meas])
    assert code == 0, err
    assert "prediction priced with shipped profiles cpu-local, loopback (oresearcher/hardware/profiles), not this host's" in out
    assert "python -m oresearcher.calibrate --backend=gloo --scenario scenarios/local-gloo.yaml" in out
    assert "then predict with runs/local-gloo/profile.yaml" in out


def test_compare_names_calibrated_profiles_without_the_hint(tmp_path, cli):
    from oresearcher.compare import main as compare_main

    pred, meas = _compare_reports(tmp_path, {"device": "cpu-calibrated", "intra_node": "gloo-calibrated",
                                             "profile_files": ["profile.yaml"]})
    code, out, err = cli(compare_main, [pred, meas])
    assert code == 0, err
    assert "prediction priced with profiles cpu-calibrated, gloo-calibrated from profile.yaml" in out
    assert "calibrate:" not in out


# ---- run directories, resumed runs, torchrun's rank 0 ----------------------------------------
def test_the_second_readme_run_is_told_about_out(tmp_path, monkeypatch, cli, capsys):
    """The README's first two run commands share runs/local-gloo/gloo: the second is refused
    in one line that names --out beside --resume and --overwrite."""
    from oresearcher.backends.run import launcher

    class Started(Exception):
        pass

    def started(*a, **k):
        raise Started

    monkeypatch.setattr(launcher, "launch_local", started)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Started):  # the first run got as far as starting its ranks
        run_main(["--backend=gloo", "--scenario", "scenarios/local-gloo.yaml"])
    capsys.readouterr()
    code, _, err = cli(run_main, ["--backend=gloo", "--scenario", "scenarios/local-gloo.yaml", "--num_agents=4",
                                  "--strategy=local_sgd", "--local_steps=10", "--steps=200", "--checkpoint_every=50",
                                  "--log-level", "WARNING"])  # without: INFO lines name the scenario file first
    one_line(code, err, "runs/local-gloo/gloo already holds a run", "--resume", "--overwrite", "--out DIR")


def _fake_report(start_step: int, steps: int) -> dict:
    return {"step_time_s": 0.02, "compute_time_s": 0.015, "comm_time_s": 0.004, "exposed_comm_time_s": 0.005,
            "peer_wait_time_s": 0.0, "comm_overhead": 0.25, "wire_bytes_per_step": 3.4e6, "breakdown": [],
            "world_size": 2, "steps": steps, "start_step": start_step, "total_time_s": 0.02 * steps,
            "backend": "gloo", "scenario": {"name": "t", "training": {"strategy": "ddp"}}}


@pytest.mark.parametrize("start, ran, title, caption", [
    (0, 400, "400 steps", "/ 400 steps (warm-up included)"),
    (20, 380, "400 steps (resumed at 20)", "/ 380 steps (since the resume at 20)"),
])
def test_torchruns_rank_0_prints_the_table_counting_the_whole_run(start, ran, title, caption, tmp_path, monkeypatch,
                                                                   cli):
    """Under torchrun (RANK, WORLD_SIZE, MASTER_* set; no launcher store) rank 0 prints the
    table a local launch prints; a resumed run's title counts all its steps."""
    import json

    from oresearcher.backends.run import worker

    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("ORESEARCHER_STORE", raising=False)
    out = tmp_path / "o"

    def rank(scenario, opts, denv, resume_step=None):
        (opts.out_dir / "report.json").write_text(json.dumps(_fake_report(start, ran)))
        return 0

    monkeypatch.setattr(worker, "run_rank", rank)
    code, stdout, err = cli(run_main, ["--scenario", scenario(tmp_path), "--out", str(out), "--log-level", "WARNING"])
    assert code == 0, err
    flat = " ".join(stdout.split())  # rich wraps a title at the table's width
    assert f"t: ddp, 2 ranks on gloo, {title}" in flat and caption in flat
    assert "step time" in stdout and "20.000 ms" in stdout


# ---- long work says so before it starts ----------------------------------------------------
def test_numeric_mode_of_a_gpu_sized_model_is_refused_with_its_estimate(tmp_path, cli):
    """gpt-1.3b on 8 agents for 200 steps: ~3e17 FLOPs on one CPU core, more than an hour."""
    out = tmp_path / "o"
    code, _, err = sim(cli, "scenarios/8xA100.yaml", "--mode", "numeric", "--out", out)
    one_line(code, err, "numeric mode computes gpt-1.3b for real on this CPU", "FLOPs", "--mode shape")
    assert not out.exists()


def test_the_numeric_estimate_by_hand(monkeypatch):
    """agents x steps x one agent's step FLOPs (measure_lm), at cpu-local's rate; the note
    appears only above WARN_S and the refusal above REFUSE_S."""
    import pytest as _pytest

    from oresearcher.errors import UserError
    from oresearcher.scenario import load_scenario
    from oresearcher.sim import numeric_cost as nc
    from oresearcher.models.workloads import measure_lm

    sc = load_scenario("scenarios/cpu-tiny.yaml", ["training.steps=3"])
    one = measure_lm("gpt-tiny", 4, 64, "fp32", False).step_flops  # 16 sequences over 4 agents
    assert nc.numeric_flops(sc) == 4 * 3 * one
    rate = nc.host_rate("fp32")
    assert rate == _pytest.approx(5.0e10 * 0.3)  # oresearcher/hardware/profiles/cpu-local.yaml: peak x efficiency
    assert nc.numeric_note(sc) is None  # well under WARN_S
    steps = int(2 * nc.WARN_S * rate / (4 * one)) + 1  # about twice WARN_S
    assert nc.numeric_note(load_scenario("scenarios/cpu-tiny.yaml", [f"training.steps={steps}"])).startswith("note:")
    steps = int(2 * nc.REFUSE_S * rate / (4 * one)) + 1
    with _pytest.raises(UserError, match="--mode shape"):
        nc.numeric_note(load_scenario("scenarios/cpu-tiny.yaml", [f"training.steps={steps}"]))
    assert nc.numeric_flops(load_scenario("scenarios/digits-4.yaml")) is None  # small tasks are not estimated


def test_the_eta_leaves_out_the_first_steps_warm_up():
    """A first step of 30 s, then 10 steps/s: after 50 steps the ETA is 5 s, not minutes."""
    import io

    from oresearcher.reporting.progress import ProgressLines

    now, out = [0.0], io.StringIO()
    p = ProgressLines(100, "x", every_s=5.0, stream=out, clock=lambda: now[0])
    for step in range(1, 101):
        now[0] = 30.0 + (step - 1) * 0.1
        p.update(step)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("x: 1/100 (1%), 0.0333 steps/s")  # the first step alone: all there is to go by
    assert lines[1].startswith("x: 51/100 (51%), 10 steps/s, ETA 4.9 s"), lines


# ---- the batch split, as a property --------------------------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 5000), agents=st.integers(1, 1024), lm=st.booleans())
def test_batch_note_is_silent_exactly_when_the_shares_add_up(batch, agents, lm):
    """Every task splits the global batch the same way (rounded down, at least one), so the
    simulator prices distillation and training on the batch training takes."""
    from types import SimpleNamespace

    from oresearcher.models.workloads import per_rank_batch
    from oresearcher.tasks import batch_note

    sc = SimpleNamespace(workload=SimpleNamespace(global_batch=batch, task="synthetic-lm" if lm else "digits"),
                         agents=SimpleNamespace(count=agents), world_size=agents)
    per = per_rank_batch(sc)
    assert per >= 1
    if batch >= agents:  # rounded down: never more than asked, less than one fewer per agent
        assert batch - agents < per * agents <= batch
    else:
        assert per == 1
    note = batch_note(sc)
    assert (note is None) == (per * agents == batch)
    if note:
        assert f"{per * agents:,} a step" in note and ("up" in note) == (per * agents > batch)


def test_collective_names_are_spelled_one_way():
    """The benchmark's names are the ops' own names in snake case (AllToAll -> all_to_all)."""
    import re

    from oresearcher.sim.bench import KINDS, OPS

    assert set(OPS) == set(KINDS)
    for name, kind in KINDS.items():
        assert name == re.sub(r"(?<!^)([A-Z])", r"_\1", kind).lower()


def test_run_refuses_a_resized_cluster_and_code_may_place_agents(tmp_path, cli):
    """The command line refuses --set cluster.gpus_per_node without agents.count; code that
    builds a scenario (a benchmark placing 4 agents on an 8-GPU node) is not second-guessed."""
    from oresearcher.scenario import load_scenario

    code, _, err = cli(run_main, ["--scenario", scenario(tmp_path), "--out", str(tmp_path / "o"),
                                  "--set", "cluster.gpus_per_node=8"])
    one_line(code, err, "--set cluster.gpus_per_node=8: the cluster has 8 GPUs but agents.count stays 2")
    sc = load_scenario("scenarios/digits-4.yaml", ["cluster.gpus_per_node=8"])
    assert (sc.cluster.world_size, sc.agents.count) == (8, 4)
