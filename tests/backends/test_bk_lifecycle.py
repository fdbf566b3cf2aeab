"""A run directory's life, in process: resume checked against the saved scenario, a
finished run left alone, damaged checkpoints skipped, the run lock, --overwrite, temp
files. ``python -m oresearcher.run``'s main() runs here with the rank launch replaced by a
stub that records the rank command line: everything these tests check happens before any
rank would start (the launcher's promise), so no process is spawned."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from bk_helpers import write_scenario
from oresearcher.backends.checkpoint import per_rank as ckpt
from oresearcher.backends.run import launcher, rundir
from oresearcher.errors import UserError, cli_main
from oresearcher.backends.run.flags import save_scenario
from oresearcher.run import main
from oresearcher.scenario import load_scenario

STEPS = (3, 7, 11)


class Spawned(Exception):
    """Raised by the stub launcher: main() got as far as starting ranks."""


@pytest.fixture
def spawn(monkeypatch):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    calls = []

    def fake(cmd, world, **kw):
        calls.append(list(cmd))
        raise Spawned(cmd)

    monkeypatch.setattr(launcher, "launch_local", fake)
    return calls


def make_run(tmp_path, steps=STEPS, world=2):
    """A run directory as a stopped 2-rank run leaves it: saved scenario and checkpoints."""
    from bk_tiny import make_learner

    sc = load_scenario(write_scenario(tmp_path / "s.yaml", training={"steps": 20}))
    out = tmp_path / "run"
    out.mkdir()
    run = ckpt.run_identity(rundir.write_manifest(out, rundir.scenario_hash(sc.resolved())))
    save_scenario(sc, out)
    learner = make_learner(sc, 0)
    for step in steps:
        for r in range(world):
            state = ckpt.agent_state(step, world, learner, {}, {"lr": sc.training.lr})
            ckpt.save_checkpoint(out, step, r, world, state, run)
    return out


def tree(root):
    """Every file under ``root`` with its bytes (what a refused command must leave alone)."""
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    """Run in an empty working directory; after the test, assert nothing was written there."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert not list(cwd.iterdir()), "something was written outside the run directory"


def call(argv, capsys, spawned_ok=False):
    """(exit code or "spawned", stdout, stderr lines) of main(argv)."""
    try:
        code = cli_main(main, ["--log-level", "WARNING", *argv])
    except Spawned:
        code = "spawned"
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


def one_error(code, err, words):
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert "Traceback" not in "\n".join(err)


# ---- resume is checked against the saved scenario ----------------------------------------
@pytest.mark.parametrize("flags, words", [
    (["--lr", "0.5"], "training.lr would change from 0.1 to 0.5"),
    (["--strategy", "local_sgd"], "training.strategy"),
    (["--set", "seed=7"], "seed would change"),
    (["--codec", "int8"], "communication.codec"),
    (["--reward_weights", "0.2,0.3,0.5"], "agents.reward_weights"),
    (["--local_steps", "5"], "training.local_steps"),
    (["--set", "workload.model=cnn"], "workload.model would change"),
    (["--set", "workload.model=cnn", "--override"], "cannot change"),
    (["--num_agents", "4", "--override"], "agents.count would change from 2 to 4"),
    (["--set", "workload.optimizer=adamw", "--override"], "workload.optimizer"),
    (["--set", "training.lr=.nan"], "training.lr"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "-5"], "--timeout"),
    (["--timeout", "nan"], "--timeout"),
    (["--keep_checkpoints", "-1"], "--keep_checkpoints"),
    (["--threads", "0"], "--threads"),
    (["--resume-step", "5"], "--resume-step 5"),
    (["--resume-step", "x"], "--resume-step"),
    (["--steps", "11"], "nothing left to train"),
    (["--out", "elsewhere"], "a run continues in its own directory"),
    (["--bogus-flag"], "unrecognized arguments"),
])
@pytest.mark.parametrize("finished", [False, True], ids=["stopped run", "finished run"])
def test_bad_flags_on_resume_are_one_line_and_exit_2(flags, words, finished, tmp_path, capsys, spawn, empty_cwd):
    out = make_run(tmp_path)
    if finished:
        (out / "report.json").write_text(json.dumps({"steps": 20, "note": "finished"}))
    before = tree(out)
    code, stdout, err = call(["--resume", str(out), *flags], capsys)
    if finished and " ".join(flags) in ("--resume-step 5", "--steps 11"):
        # checked against the checkpoints, after the finished check: the documented no-op
        assert code == 0 and not err and "nothing to resume, report.json left as it is" in stdout
    else:
        one_error(code, err, words)
    assert not spawn and tree(out) == before  # no lock left, nothing rewritten, nothing removed


@pytest.mark.parametrize("argv, words", [
    (["--override"], "--override only applies to --resume"),
    (["--num_agents", "100000"], "agents.count"),
    (["--steps", "true"], "--steps"),
    (["--resume", "no/such/run"], "no such run directory"),
])
def test_bad_flags_on_a_new_run_are_one_line_and_exit_2(argv, words, tmp_path, capsys, spawn, empty_cwd):
    sc = write_scenario(tmp_path / "s.yaml")
    code, _, err = call(["--scenario", str(sc), "--out", str(tmp_path / "run"), *argv], capsys)
    one_error(code, err, words)
    assert not spawn and not (tmp_path / "run").exists()


def test_resume_with_an_unchanged_or_free_flag_starts_from_the_newest_step(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    code, _, err = call(["--resume", str(out), "--steps", "30", "--checkpoint_every", "2"], capsys)
    assert code == "spawned" and not err, err
    assert spawn[0][-2:] == ["--resume-step", "11"]


def test_override_rewrites_the_saved_scenario_and_says_what_changed(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    code, _, err = call(["--resume", str(out), "--lr", "0.5", "--strategy", "local_sgd", "--override"], capsys)
    assert code == "spawned"
    assert len(err) == 2 and all("--override:" in line for line in err), err
    saved = load_scenario(out / "scenario.yaml")
    assert saved.training.lr == 0.5 and saved.training.strategy == "local_sgd"


def test_keep_lr_puts_the_new_lr_into_the_restored_optimizer(tmp_path):
    from bk_tiny import make_learner
    from oresearcher.scenario import validate
    from bk_helpers import TINY

    old = make_learner(validate(TINY, "t"), 0)
    state = ckpt.agent_state(3, 1, old, {}, {"lr": 0.1})
    new_sc = validate({**TINY, "training": {**TINY["training"], "lr": 0.5}}, "t")
    for keep, expect in ((False, 0.1), (True, 0.5)):
        fresh = make_learner(new_sc, 0)
        ckpt.restore_agent(state, fresh, {}, keep_lr=keep)
        assert [g["lr"] for g in fresh.optimizer.param_groups] == [expect]
        assert fresh.optimizer.state_dict()["state"].keys() == old.optimizer.state_dict()["state"].keys()


# ---- a finished run ---------------------------------------------------------------------
def test_resume_of_a_finished_run_is_a_no_op_that_says_so(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    (out / "report.json").write_text(json.dumps({"steps": 20, "note": "finished"}))
    before = (out / "report.json").read_bytes(), (out / "report.json").stat().st_mtime_ns
    code, stdout, err = call(["--resume", str(out), "--steps", "40"], capsys)
    assert code == 0 and not err and not spawn
    assert stdout.strip().splitlines() == [f"{out}: the run finished (20 steps); nothing to resume, "
                                           "report.json left as it is"]
    assert ((out / "report.json").read_bytes(), (out / "report.json").stat().st_mtime_ns) == before


def test_resume_without_checkpoints_refuses_once_before_any_rank_starts(tmp_path, capsys, spawn):
    out = make_run(tmp_path, steps=())
    code, _, err = call(["--resume", str(out)], capsys)
    one_error(code, err, "no checkpoint that all 2 ranks completed")
    assert not spawn


# ---- damaged checkpoints ------------------------------------------------------------------
def _pt(out, r=1):
    return ckpt.rank_file(out, 11, r)


def _man(out, r=1):
    return ckpt.manifest_file(out, 11, r)


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_manifest(out, **fields):
    m = json.loads(_man(out).read_text())
    m.update(fields)
    _man(out).write_text(json.dumps(m))


DAMAGES = {
    "truncated": (lambda o: _pt(o).write_bytes(_pt(o).read_bytes()[:1000]), "bytes, its manifest says"),
    "empty file": (lambda o: _pt(o, 0).write_bytes(b""), "rank 0: rank-0000.pt has 0 bytes"),
    "garbage, same size": (lambda o: _pt(o).write_bytes(os.urandom(_pt(o).stat().st_size)), "checksum"),
    "one bit flipped": (lambda o: _flip(_pt(o)), "fails its checksum"),
    "manifest missing": (lambda o: _man(o).unlink(), "no manifest"),
    "manifest not json": (lambda o: _man(o).write_text("{not json"), "manifest is unreadable"),
    "manifest a list": (lambda o: _man(o).write_text("[1, 2]"), "manifest is unreadable"),
    "manifest empty": (lambda o: _man(o).write_text(""), "manifest is unreadable"),
    "manifest of another step": (lambda o: shutil.copy(ckpt.manifest_file(o, 7, 1), _man(o)), "another step"),
    "manifest checksum wrong": (lambda o: _edit_manifest(o, files={"rank-0001.pt": {
        "bytes": _pt(o).stat().st_size, "sha256": "0" * 64}}), "fails its checksum"),
    "file missing": (lambda o: _pt(o).unlink(), "rank-0001.pt is missing"),
    "file is a directory": (lambda o: (_pt(o).unlink(), _pt(o).mkdir()), "rank 1"),
    "rank never saved": (lambda o: (_pt(o).unlink(), _man(o).unlink()), "no manifest"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_a_damaged_newest_checkpoint_is_skipped_for_the_newest_intact_one(damage, tmp_path, capsys, spawn, empty_cwd):
    out = make_run(tmp_path)
    hurt, words = DAMAGES[damage]
    hurt(out)
    before = tree(out)
    code, _, err = call(["--resume", str(out)], capsys)
    assert code == "spawned", err
    assert tree(out) == before  # skipped, not deleted: nothing is lost before a rank has trained past it
    assert spawn[0][-2:] == ["--resume-step", "7"]
    assert len(err) == 1 and "checkpoint step 11 skipped" in err[0] and words in err[0], err


@pytest.mark.parametrize("damage", ["truncated", "manifest missing", "one bit flipped"])
def test_asking_for_a_damaged_step_is_one_line_and_exit_2(damage, tmp_path, capsys, spawn, empty_cwd):
    out = make_run(tmp_path)
    DAMAGES[damage][0](out)
    before = tree(out)
    code, _, err = call(["--resume", str(out), "--resume-step", "11"], capsys)
    one_error(code, err, "--resume-step 11: rank")
    assert tree(out) == before and not spawn
    assert "complete steps: 3, 7" in err[0] or "complete steps: 3, 7, 11" in err[0]


def test_resume_step_takes_an_older_intact_step(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    code, _, err = call(["--resume", str(out), "--resume-step", "3"], capsys)
    assert code == "spawned" and spawn[0][-2:] == ["--resume-step", "3"], err


def test_every_step_damaged_is_one_line(tmp_path, capsys, spawn, empty_cwd):
    out = make_run(tmp_path)
    for step in STEPS:
        ckpt.rank_file(out, step, 0).write_bytes(b"x")
    before = tree(out)
    code, _, err = call(["--resume", str(out)], capsys)
    one_error(code, err, "nothing to resume (step 11 skipped: rank 0")
    assert tree(out) == before and not spawn
    assert "2 more skipped" in err[0]


def test_temp_files_are_removed_when_a_run_starts(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    tmps = [ckpt.step_dir(out, s) / f".rank-000{s % 2}.pt.tmp-424242" for s in (3, 11)]
    for t in tmps:
        t.write_bytes(b"half")
    assert call(["--resume", str(out)], capsys)[0] == "spawned"
    assert not any(t.exists() for t in tmps)


# ---- one run per directory ------------------------------------------------------------------
def test_a_live_lock_refuses_a_second_run(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    with rundir.RunLock(out):  # this very process holds it: alive
        code, _, err = call(["--resume", str(out)], capsys)
        one_error(code, err, f"in use by a running run (pid {os.getpid()})")
        assert (out / rundir.LOCK).exists()
    assert not (out / rundir.LOCK).exists() and not spawn


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path, caplog):
    lock = tmp_path / rundir.LOCK
    lock.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    with caplog.at_level("WARNING"), rundir.RunLock(tmp_path):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert "taking over the stale lock" in caplog.text and not lock.exists()


def test_a_lock_from_another_host_is_refused(tmp_path):
    (tmp_path / rundir.LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere.example"}))
    with pytest.raises(UserError, match="in use by pid 1 on elsewhere.example"):
        rundir.RunLock(tmp_path).acquire()
    assert json.loads((tmp_path / rundir.LOCK).read_text())["host"] == "elsewhere.example"


def test_a_new_run_into_a_run_directory_refuses_unless_overwrite(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    (out / "notes.txt").write_text("mine")
    (out / "curve.png").write_bytes(b"the earlier run's figure")
    sc = write_scenario(tmp_path / "s4.yaml", agents={"count": 4})
    code, _, err = call(["--scenario", str(sc), "--out", str(out)], capsys)
    one_error(code, err, "already holds a run")
    assert ckpt.steps_held(out, 0) == list(STEPS) and not spawn
    code, _, err = call(["--scenario", str(sc), "--out", str(out), "--overwrite"], capsys)
    assert code == "spawned"
    assert not (out / "checkpoints").exists() and (out / "notes.txt").read_text() == "mine"
    assert not (out / "curve.png").exists()  # no figure of the earlier run beside the new one's
    assert load_scenario(out / "scenario.yaml").agents.count == 4


# ---- checkpoints belong to their run -------------------------------------------------------
def test_a_rank_file_from_another_run_is_skipped_in_one_line(tmp_path, capsys, spawn, empty_cwd):
    out = make_run(tmp_path)
    (tmp_path / "other").mkdir()
    theirs = make_run(tmp_path / "other")  # another run (another run id), same scenario
    for f in (ckpt.rank_file, ckpt.manifest_file):
        shutil.copy(f(theirs, 11, 1), f(out, 11, 1))
    code, _, err = call(["--resume", str(out)], capsys)
    assert code == "spawned" and spawn[0][-2:] == ["--resume-step", "7"], err
    assert len(err) == 1 and "checkpoint step 11 skipped: rank 1: it belongs to another run" in err[0], err
    code, _, err = call(["--resume", str(out), "--resume-step", "11"], capsys)
    one_error(code, err, "--resume-step 11: rank 1's checkpoint cannot be used: it belongs to another run")


def test_a_checkpoint_saved_under_a_scenario_the_run_never_trained_is_skipped(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    m = json.loads(_man(out).read_text())
    m["scenario_sha256"] = "0" * 64  # same run id, a scenario (seed, lr...) that is not this run's
    _man(out).write_text(json.dumps(m))
    code, _, err = call(["--resume", str(out)], capsys)
    assert code == "spawned" and spawn[0][-2:] == ["--resume-step", "7"], err
    assert len(err) == 1 and "a scenario this run never trained" in err[0], err


def test_an_override_adds_the_new_scenario_to_the_run(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    before = rundir.read_manifest(out)
    assert call(["--resume", str(out), "--lr", "0.5", "--override"], capsys)[0] == "spawned"
    after = rundir.read_manifest(out)
    assert after["run_id"] == before["run_id"] and after["scenarios"][:1] == before["scenarios"]
    assert after["scenarios"][-1] == rundir.scenario_hash(load_scenario(out / "scenario.yaml").resolved())
    assert len(after["scenarios"]) == 2 and ckpt.invalid(out, 11, 0, ckpt.run_identity(after)) is None


@pytest.mark.parametrize("text", ["{not json", "[]", '{"run_id": 5, "scenarios": []}', ""])
def test_an_unreadable_run_manifest_is_one_line(tmp_path, capsys, spawn, text):
    out = make_run(tmp_path)
    (out / rundir.MANIFEST).write_text(text)
    code, _, err = call(["--resume", str(out)], capsys)
    one_error(code, err, "the run manifest is unreadable")
    assert not spawn


# ---- --overwrite removes only what a run wrote ------------------------------------------
def test_overwrite_refuses_a_directory_no_run_wrote(tmp_path, capsys, spawn, empty_cwd):
    mine = tmp_path / "mine"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "checkpoints" / "my_model.pt").write_bytes(b"weights")
    (mine / "tensorboard").mkdir()
    (mine / "scenario.yaml").write_text("mine")
    before = tree(mine)
    sc = write_scenario(tmp_path / "s.yaml")
    code, _, err = call(["--scenario", str(sc), "--out", str(mine), "--overwrite"], capsys)
    one_error(code, err, "holds files that no run wrote")
    assert tree(mine) == before and (mine / "tensorboard").is_dir() and not spawn


def test_overwrite_leaves_what_the_run_did_not_write(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    (out / "checkpoints" / "my_model.pt").write_bytes(b"weights")
    (out / "notes.txt").write_text("mine")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    m = json.loads((out / rundir.MANIFEST).read_text())
    m["writes"] += ["notes.txt", "../outside.txt"]  # a tampered manifest names files that are not a run's
    (out / rundir.MANIFEST).write_text(json.dumps(m))
    old_id = m["run_id"]
    sc = write_scenario(tmp_path / "s4.yaml", agents={"count": 4})
    assert call(["--scenario", str(sc), "--out", str(out), "--overwrite"], capsys)[0] == "spawned"
    assert not list((out / "checkpoints").glob("step-*"))
    assert (out / "checkpoints" / "my_model.pt").read_bytes() == b"weights"
    assert (out / "notes.txt").read_text() == "mine" and outside.read_text() == "keep"
    assert rundir.read_manifest(out)["run_id"] != old_id  # a new run, a new id


# ---- never write through a link -----------------------------------------------------------
def test_writes_replace_links_planted_at_their_names(tmp_path):
    from oresearcher.reporting.report import write_json
    from oresearcher.reporting.figures import _save
    import matplotlib.pyplot as plt

    out, victim = tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious")
    for name in ("report.json", f".report.json.tmp-{os.getpid()}", "summary.png", "scenario.yaml"):
        (out / name).symlink_to(victim)
    write_json(out / "report.json", {"steps": 1})
    _save(plt.figure(), out / "summary.png")
    save_scenario(load_scenario(write_scenario(tmp_path / "s.yaml")), out)
    assert victim.read_text() == "precious"
    for name in ("report.json", "summary.png", "scenario.yaml"):
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0
    assert json.loads((out / "report.json").read_text()) == {"steps": 1}


def test_a_linked_step_folder_is_refused_and_nothing_is_written_through_it(tmp_path):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    ckpt.step_dir(out, 3).parent.mkdir(parents=True)
    ckpt.step_dir(out, 3).symlink_to(elsewhere)
    with pytest.raises(UserError, match="step-00000003 is a symbolic link"):
        ckpt.save_checkpoint(out, 3, 0, 2, {"x": torch.zeros(1)})
    assert not list(elsewhere.iterdir())


# ---- a damaged report is no finished run ------------------------------------------------------
@pytest.mark.parametrize("text", ["{not json", "[]", '{"steps": "?"}', '{"steps": 0}', ""])
def test_a_damaged_report_is_one_line_not_a_finished_run(tmp_path, capsys, spawn, text):
    out = make_run(tmp_path)
    (out / "report.json").write_text(text)
    code, stdout, err = call(["--resume", str(out)], capsys)
    one_error(code, err, "report.json is damaged")
    assert "finished" not in stdout and (out / "report.json").read_text() == text and not spawn


# ---- a destination that cannot be written is one line, before anything runs -----------------
@pytest.mark.parametrize("where, words", [("file", "a file, not a directory"),
                                          ("under a file", "is a file, so no directory can be made under it")])
def test_an_out_that_is_or_is_under_a_file_is_one_line(tmp_path, capsys, spawn, where, words):
    blocker = tmp_path / "blocker"
    blocker.write_text("mine")
    out = blocker if where == "file" else blocker / "run"
    sc = write_scenario(tmp_path / "s.yaml")
    code, _, err = call(["--scenario", str(sc), "--out", str(out)], capsys)
    one_error(code, err, words)
    assert blocker.read_text() == "mine" and not spawn


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_out_is_one_line(tmp_path, capsys, spawn):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, _, err = call(["--scenario", str(write_scenario(tmp_path / "s.yaml")), "--out", str(ro / "run")], capsys)
    finally:
        ro.chmod(0o700)
    one_error(code, err, "cannot create the directory")


def test_a_lock_that_is_a_directory_is_one_line(tmp_path, capsys, spawn):
    out = make_run(tmp_path)
    (out / rundir.LOCK).mkdir()
    code, _, err = call(["--resume", str(out)], capsys)
    one_error(code, err, ".lock is a directory, not a run lock")
    assert (out / rundir.LOCK).is_dir() and not spawn


def test_sim_and_calibrate_refuse_an_out_under_a_file_before_they_work(tmp_path, capsys, monkeypatch):
    from oresearcher import calibrate
    from oresearcher.sim.__main__ import main as sim_main

    blocker = tmp_path / "blocker"
    blocker.write_text("mine")
    code = cli_main(sim_main, ["scenarios/local-gloo.yaml", "--set", "training.steps=2", "--out", str(blocker)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "a file, not a directory" in err[-1], err
    monkeypatch.setattr(calibrate, "_launch", lambda *a: pytest.fail("measured into a destination it cannot write"))
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    code = cli_main(calibrate.main, ["--scenario", "scenarios/local-gloo.yaml", "--out", str(blocker / "p.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and f"{blocker}: a file, not a directory" in err[-1] and len(err) <= 3, err
    assert blocker.read_text() == "mine"


# ---- intact bytes that are no checkpoint ---------------------------------------------------------
class _Code:
    def __reduce__(self):
        return (os.system, ("true",))


def _replace_with(out, data: bytes):
    """Rank 1's file of step 11 replaced by ``data``, its manifest updated to match (size, checksum)."""
    from oresearcher.files import sha256_file

    _pt(out).write_bytes(data)
    _edit_manifest(out, files={"rank-0001.pt": {"bytes": len(data), "sha256": sha256_file(_pt(out))}})


@pytest.mark.parametrize("make, words", [
    (lambda p: torch.save({"step": 11, "x": _Code()}, p), "it holds more than tensors (Trying to load unsupported"),
    (lambda p: p.write_bytes(b"PK\x03\x04 not a zip"), "cannot be loaded: PytorchStreamReader failed reading zip"),
])
def test_a_file_that_passes_its_checksum_but_cannot_be_loaded_falls_back(tmp_path, capsys, spawn, make, words):
    out = make_run(tmp_path)
    scratch = tmp_path / "x.pt"
    make(scratch)
    _replace_with(out, scratch.read_bytes())
    code, _, err = call(["--resume", str(out)], capsys)
    assert code == "spawned" and spawn[0][-2:] == ["--resume-step", "7"], err
    assert len(err) == 1 and "checkpoint step 11 skipped: rank 1: rank-0001.pt" in err[0] and words in err[0], err
    assert "Re-running" not in err[0] and "weights_only` set to `False" not in err[0]
