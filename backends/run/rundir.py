"""A run directory's life: who owns it, whether it holds a run, whether that run finished.

    <out>/.lock            {"pid", "host", "started"} of the run that owns the directory
    <out>/run.json         the run manifest: its run id, the hashes of the scenarios it has
                           trained, and the names it writes (written before anything else)
    <out>/scenario.yaml    the scenario it trains (the truth a resume is checked against)
    <out>/report.json      written last, by rank 0: its presence means the run finished
    <out>/checkpoints/     per-rank checkpoints (oresearcher.backends.checkpoint.per_rank)
    <out>/tensorboard/     TensorBoard events

One run at a time: :func:`acquire` creates the lock file with O_EXCL, so of two runs
started at once exactly one wins. A lock left by a process that no longer runs (same
host, pid gone) is stale and taken over with a note; a live one, or one from another
host (whose pid cannot be checked from here), is refused in one line. A new run into a
directory that already holds a run is refused unless ``--overwrite``, which removes only
what the run manifest names (of ``RUN_FILES``; in ``checkpoints/`` only the step folders);
a non-empty directory with no manifest holds no run of ours and is refused even with
``--overwrite``: its files were never ours to delete.

Every checkpoint's manifest carries the run id and the scenario hash
(:mod:`oresearcher.backends.checkpoint.per_rank`), so a rank file copied in from another run is
told apart from the run's own and never loaded.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Optional

from oresearcher.errors import UserError

log = logging.getLogger(__name__)

LOCK = ".lock"
REPORT = "report.json"
MANIFEST = "run.json"
RUN_FILES = ("scenario.yaml", REPORT, "trace.json", "checkpoints", "tensorboard",
             "summary.png", "timeline.png", "breakdown.png", "curve.png")  # figures: reporting/figures.py


def scenario_hash(resolved: dict) -> str:
    """SHA-256 of what a scenario trains: its resolved fields, less those a resume may
    change freely (how long, how often to save or evaluate: oresearcher.scenario.resume.FREE)."""
    from oresearcher.scenario.resume import FREE, flatten

    kept = {k: v for k, v in flatten(resolved).items() if k not in FREE}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def read_manifest(out: Path) -> Optional[dict]:
    """The run manifest of ``out`` ({"run_id", "scenarios", "writes"}), or None when there is
    none; UserError when it is there but unreadable (a run's identity is not guessed)."""
    path = Path(out) / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = json.loads(path.read_text())
        ok = (isinstance(data, dict) and isinstance(data.get("run_id"), str) and isinstance(data.get("scenarios"), list)
              and all(isinstance(h, str) for h in data["scenarios"]))
    except (OSError, ValueError, RecursionError):
        ok = False
    if not ok:
        raise UserError(f"{path}: the run manifest is unreadable; this directory's run cannot be identified "
                        "(restore the file, or start a new run elsewhere)")
    return data


def write_manifest(out: Path, digest: str) -> dict:
    """Start ``out``'s manifest (a new run: a fresh run id), or add ``digest`` to the
    scenarios of the run it holds (a resume that changed the scenario on purpose)."""
    from oresearcher.files import write_atomic

    data = read_manifest(out) or {"run_id": uuid.uuid4().hex, "scenarios": [], "writes": list(RUN_FILES)}
    if digest not in data["scenarios"]:
        data["scenarios"].append(digest)
    write_atomic(Path(out) / MANIFEST, json.dumps(data, indent=1).encode(), root=out)
    return data


def finished(out: Path) -> Optional[dict]:
    """The finished run's report (rank 0 writes it last), or None when the run is not done.
    UserError when a report is there but unreadable: neither finished nor to be overwritten."""
    path = Path(out) / REPORT
    if not path.exists() and not path.is_symlink():
        return None
    try:
        report = json.loads(path.read_text())
        steps = report.get("steps") if isinstance(report, dict) else None
    except (OSError, ValueError, RecursionError):
        steps = None
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise UserError(f"{path} is damaged (not a report of a finished run); move it aside and --resume "
                        f"{out} again to write it from the checkpoints")
    return report


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _read_lock(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class RunLock:
    """The lock file of one run directory; release() removes it if it is still ours."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK
        self.me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}

    def acquire(self) -> "RunLock":
        from oresearcher.files import writable_dir

        writable_dir(self.path.parent)  # a file in the way, a read-only disk: one line, before anything runs
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            except OSError as e:
                raise UserError(f"{self.path}: cannot create the run lock: {e.strerror or e}") from None
            with os.fdopen(fd, "w") as f:
                json.dump(self.me, f)
            return self
        raise UserError(f"{self.path.parent}: cannot take the run lock {self.path}")

    def _take_over_if_stale(self) -> None:
        if self.path.is_dir() and not self.path.is_symlink():
            raise UserError(f"{self.path} is a directory, not a run lock; remove it (a run's lock is a small file)")
        held = _read_lock(self.path)
        pid, host = held.get("pid"), held.get("host")
        where = self.path.parent
        if host not in (None, self.me["host"]):
            raise UserError(f"{where}: in use by pid {pid} on {host} (lock {self.path}); "
                            "if that run is gone, delete the lock file")
        if isinstance(pid, int) and pid_alive(pid):
            raise UserError(f"{where}: in use by a running run (pid {pid}); wait for it or use another --out")
        log.warning("%s: taking over the stale lock of pid %s, which is no longer running", where, pid)
        self.path.unlink(missing_ok=True)

    def release(self) -> None:
        if _read_lock(self.path).get("pid") == self.me["pid"]:
            self.path.unlink(missing_ok=True)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def holds_run(out: Path) -> list[str]:
    """What in ``out`` belongs to an earlier run (everything but the lock file)."""
    out = Path(out)
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name != LOCK)


def prepare_new(out: Path, overwrite: bool) -> None:
    """Make ``out`` ready for a new run: refuse a non-empty one unless ``overwrite`` and
    its manifest says a run wrote it; then remove only what that manifest names."""
    held = holds_run(out)
    if not held:
        return
    shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
    manifest = read_manifest(out)
    if manifest is None:
        raise UserError(f"{out} holds files that no run wrote ({shown}); a new run needs an empty or new "
                        "directory (--overwrite replaces only a run's own files)")
    if not overwrite:
        raise UserError(f"{out} already holds a run ({shown}); continue it with --resume {out}, "
                        "replace it with --overwrite, or give this run its own directory with --out DIR")
    for name in set(manifest.get("writes") or ()) & set(RUN_FILES):  # never a name a tampered manifest adds
        _remove(Path(out) / name, only_steps=name == "checkpoints")
    (Path(out) / MANIFEST).unlink()
    log.warning("%s: --overwrite removed the earlier run", out)


def _remove(path: Path, only_steps: bool) -> None:
    """Remove a run's entry; a link is removed itself, never what it points to. In
    ``checkpoints/`` only the step folders a run writes, then the folder if that empties it."""
    if not path.is_dir() or path.is_symlink():
        path.unlink(missing_ok=True)
        return
    if not only_steps:
        shutil.rmtree(path)
        return
    for step in path.glob("step-*"):
        if step.is_dir() and not step.is_symlink():
            shutil.rmtree(step)
        else:
            step.unlink()
    try:
        path.rmdir()
    except OSError:
        pass  # something the run did not write is in there: left as it is


def remove_temp_files(out: Path) -> int:
    """Remove half-written checkpoint files (``.rank-*.pt.tmp-PID``) of runs that are gone."""
    base = Path(out) / "checkpoints"
    if not base.is_dir():
        return 0
    removed = 0
    for path in base.glob("step-*/.rank-*.tmp-*"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
