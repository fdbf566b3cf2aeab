"""A property over kill points and tampering (hypothesis): from the directory a short gloo
run leaves when it is killed at a random point and then tampered with at random, a resume
either starts from a checkpoint step whose files are byte for byte the uninterrupted run's
(so it continues that run bit-identically: tests/backends/test_bk_resume_exact.py and
test_bk_nothing_lost.py run such resumes for real) and the newest such step, or refuses
in one line; nothing outside the run directory is touched either way.

A kill point is cut back from a complete run, the way test_bk_resume_exact.py cuts a copy:
a kill after step k's checkpoint drops the newer steps and the report; a kill inside rank
r's save of step k also leaves that rank's half-written temp file and no manifest. The
resume runs main() in process up to the rank launch (the launcher decides the step before
any rank starts), so an example costs milliseconds and only the reference run is real.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from bk_helpers import REPO, write_scenario
from oresearcher.backends.checkpoint import per_rank as ckpt
from oresearcher.backends.run import launcher, rundir
from oresearcher.errors import cli_main
from oresearcher.run import main

STEPS, WORLD = 6, 2
TAMPERS = ("none", "flip a bit", "truncate", "another run's file", "link report.json out", "link a step out",
           "damage run.json", "lock is a folder", "damage report.json", "pickled code")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("tamper")
    sc = write_scenario(d / "s.yaml", training={"steps": STEPS, "checkpoint_every": 1})
    p = subprocess.run([sys.executable, "-m", "oresearcher.run", "--no-tensorboard", "--no-progress", "--timeout", "30",
                        "--log-level", "WARNING", "--learner", "bk_tiny:make_learner", "--scenario", str(sc),
                        "--out", str(d / "ref"), "--keep_checkpoints", "0"],
                       cwd=REPO, capture_output=True, text=True, timeout=180, env=_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return d / "ref"


def _env():
    from bk_helpers import child_environment

    return child_environment()


def _kill(ref, out, step: int, rank: int, mid_save: bool) -> None:
    shutil.copytree(ref, out, symlinks=True)
    for name in rundir.RUN_FILES:
        if name not in ("scenario.yaml", "checkpoints") and (out / name).exists():
            (out / name).unlink()
    for s in ckpt.all_steps(out):
        if s > step:
            shutil.rmtree(ckpt.step_dir(out, s))
    if mid_save:
        pt = ckpt.rank_file(out, step, rank)
        (pt.parent / f".{pt.name}.tmp-999999").write_bytes(pt.read_bytes()[: pt.stat().st_size // 2])
        pt.unlink()
        ckpt.manifest_file(out, step, rank).unlink()


def _tamper(out, outside, what: str, step: int, rank: int) -> None:
    pt, man = ckpt.rank_file(out, step, rank), ckpt.manifest_file(out, step, rank)
    if what == "flip a bit" and pt.exists():
        data = bytearray(pt.read_bytes())
        data[len(data) // 2] ^= 1
        pt.write_bytes(bytes(data))
    elif what == "truncate" and pt.exists():
        pt.write_bytes(pt.read_bytes()[:100])
    elif what == "another run's file" and man.exists():
        m = json.loads(man.read_text())
        m["run_id"] = "f" * 32
        man.write_text(json.dumps(m))
    elif what == "link report.json out":
        (out / "report.json").symlink_to(outside / "victim.txt")
    elif what == "link a step out":
        shutil.rmtree(ckpt.step_dir(out, step))
        ckpt.step_dir(out, step).symlink_to(outside / "dir", target_is_directory=True)
    elif what == "damage run.json":
        (out / rundir.MANIFEST).write_text("{")
    elif what == "lock is a folder":
        (out / rundir.LOCK).mkdir()
    elif what == "damage report.json":
        (out / "report.json").write_text('{"steps": "?"}')
    elif what == "pickled code" and pt.exists():
        from oresearcher.files import sha256_file

        pt.write_bytes(b"\x80\x04cposix\nsystem\n.")  # a pickle of os.system, manifest made to match
        m = json.loads(man.read_text()) if man.exists() else None
        if m is not None:
            m["files"][pt.name] = {"bytes": pt.stat().st_size, "sha256": sha256_file(pt)}
            man.write_text(json.dumps(m))


def _snapshot(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _same_as_reference(out, ref, step: int) -> bool:
    return all(f(out, step, r).is_file() and not f(out, step, r).is_symlink()
               and f(out, step, r).read_bytes() == f(ref, step, r).read_bytes()
               for r in range(WORLD) for f in (ckpt.rank_file, ckpt.manifest_file)) \
        and not ckpt.step_dir(out, step).is_symlink()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(0, STEPS - 1), rank=st.integers(0, WORLD - 1), mid_save=st.booleans(),
       tamper=st.sampled_from(TAMPERS), tamper_rank=st.integers(0, WORLD - 1), tamper_back=st.integers(0, 2))
def test_a_resume_continues_the_uninterrupted_run_or_refuses_in_one_line(
        reference, tmp_path_factory, monkeypatch, capsys, step, rank, mid_save, tamper, tamper_rank, tamper_back):
    base = tmp_path_factory.mktemp("case")
    out, outside = base / "run", base / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "victim.txt").write_text("outside")
    _kill(reference, out, step, rank, mid_save)
    _tamper(out, outside, tamper, max(0, step - tamper_back), tamper_rank)
    before = _snapshot(outside)

    spawned = []

    def fake_launch(cmd, world, **kw):
        spawned.append(list(cmd))
        return launcher.LaunchResult([0] * world)

    monkeypatch.setattr(launcher, "launch_local", fake_launch)
    monkeypatch.setattr("oresearcher.backends.run.command._outcome", lambda result, out, world: 0)
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    code = cli_main(main, ["--log-level", "ERROR", "--resume", str(out), "--learner", "bk_tiny:make_learner"])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln]

    assert _snapshot(outside) == before, "a file outside the run directory changed"
    if spawned:
        assert code == 0
        chosen = int(spawned[0][spawned[0].index("--resume-step") + 1])
        intact = [s for s in range(STEPS) if _same_as_reference(out, reference, s)]
        assert chosen == max(intact), (tamper, chosen, intact)  # the reference's bytes, and the newest such
        event(f"resumed ({tamper})")
    else:
        assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (tamper, err)
        assert "Traceback" not in err[0]
        event(f"refused ({tamper})")
