"""A run directory's life: who owns it, whether it holds a run, whether that run finished.

    <out>/.lock            {"pid", "host", "started"} of the run that owns the directory
    <out>/scenario.yaml    the scenario it trains (the truth a resume is checked against)
    <out>/report.json      written last, by rank 0: its presence means the run finished
    <out>/checkpoints/     per-rank checkpoints (oresearcher.backends.checkpoint)
    <out>/tensorboard/     TensorBoard events

One run at a time: :func:`acquire` creates the lock file with O_EXCL, so of two runs
started at once exactly one wins. A lock left by a process that no longer runs (same
host, pid gone) is stale and taken over with a note; a live one, or one from another
host (whose pid cannot be checked from here), is refused in one line. A new run into a
directory that already holds a run is refused unless ``--overwrite``, which removes only
what a run writes (``RUN_FILES``).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Optional

from oresearcher.errors import UserError

log = logging.getLogger(__name__)

LOCK = ".lock"
REPORT = "report.json"
RUN_FILES = ("scenario.yaml", REPORT, "trace.json", "checkpoints", "tensorboard",
             "summary.png", "timeline.png", "breakdown.png", "curve.png")  # figures: reporting/figures.py


def finished(out: Path) -> Optional[dict]:
    """The finished run's report (rank 0 writes it last), or None when the run is not done."""
    path = Path(out) / REPORT
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # present but unreadable: still finished; never overwrite it


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self.me, f)
            return self
        raise UserError(f"{self.path.parent}: cannot take the run lock {self.path}")

    def _take_over_if_stale(self) -> None:
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
    """Make ``out`` ready for a new run: refuse a non-empty one unless ``overwrite``."""
    held = holds_run(out)
    if not held:
        return
    if not overwrite:
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise UserError(f"{out} already holds a run ({shown}); continue it with --resume {out} "
                        "or replace it with --overwrite")
    for name in RUN_FILES:
        path = Path(out) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    log.warning("%s: --overwrite removed the earlier run", out)


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
