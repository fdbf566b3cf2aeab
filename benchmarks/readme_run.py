"""Running the README's commands for readme_blocks.py: a block, a cached subprocess run at a
fixed width, and the fenced-output helpers."""
from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = 100


@dataclass
class Block:
    name: str
    command: str  # what the README says prints it
    generate: Callable[[], str]  # the text between the markers
    quick: bool = True
    images: dict = field(default_factory=dict)  # file a run wrote -> README image path


# ---- running things ---------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def run(cmd: str, cwd: Path = ROOT, stderr: bool = False, ok=(0,), columns: int = COLUMNS) -> str:
    """Run ``cmd`` as the README shows it (python = this interpreter); its stdout (and
    stderr after it, with ``stderr``), trailing spaces stripped. Once per process: two
    blocks made from one run share it."""
    argv = shlex.split(cmd)
    if argv[0] == "python":
        argv[0] = sys.executable
    env = dict(os.environ, COLUMNS=str(columns), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    env.pop("FORCE_COLOR", None)
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode not in ok:
        raise RuntimeError(f"{cmd}: exit {p.returncode}\n{p.stderr[-2000:]}")
    text = p.stdout + (p.stderr if stderr else "")
    return "\n".join(line.rstrip() for line in text.splitlines())


def fence(text: str) -> str:
    return f"```\n{text.strip(chr(10))}\n```\n"


def transcript(*commands: str, **kw) -> str:
    """A terminal transcript: ``$ command`` then what it printed, for each command."""
    return fence("\n".join(f"$ {c}\n{run(c, **kw)}" for c in commands))


def _report(cmd: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run(f"{cmd} --out {tmp}")
        return json.loads((Path(tmp) / "report.json").read_text())
