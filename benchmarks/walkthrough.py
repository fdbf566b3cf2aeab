"""Run every command the README and the docs pages show, as written, the way a newcomer
would, and check each exits as documented: 0 where the page shows it working, 2 with one
error line where the page shows a refusal (its `error:` line's first words).

    python benchmarks/walkthrough.py                   # every page, in page order
    python benchmarks/walkthrough.py --pages README.md,cli.md --timeout 300
    python benchmarks/walkthrough.py --list            # the commands, run nothing

Each page runs in a directory of its own holding a copy of the repository's scenarios/
and tests/data/ (the paths the commands name), so a command's runs/ land there and a
later command on the page (a --resume, a compare, an export check) finds them. A refusal
the page shows after a setup it describes in words (a directory holding a user's files, a
profile with an impossible number, a finished run) gets that setup first (``SETUPS``).
A refusal passes when the command exits 2 and its last line starts with the page's
`error:` line (up to its first 40 characters). Commands
that need hardware this machine may not have are listed and not run: `--backend=nccl`
without a GPU, `torchrun`, `--sweep-backend ray` without ray. A command still running
after --timeout seconds counts as a failure. A working command the page shows a second
time, with its output, ran the first time and is not run again. Prints one row per command and exits 1 if
any command did not exit as documented.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from readme_blocks import BAD_YAML  # the bad scenario file scenarios.md shows refused

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"^(?:\$ )?python -m (oresearcher\.[\w.]+)(.*)$")
FENCE = re.compile(r"^```")


@dataclass
class Command:
    page: str
    line: int
    argv: list[str]
    refusal: str | None  # the documented error line's first words, or None: it works

    @property
    def text(self) -> str:
        return "python " + " ".join(shlex.quote(a) for a in self.argv)


def commands(page: Path) -> list[Command]:
    """The page's commands in fenced blocks, in order; a command is a refusal when the
    output shown after it (up to the next command or the block's end) has an `error:` line."""
    out, lines, in_block = [], page.read_text().splitlines(), False
    for i, raw in enumerate(lines):
        if FENCE.match(raw.strip()):
            in_block = not in_block
            continue
        m = COMMAND.match(raw.strip()) if in_block else None
        if not m:
            continue
        text, j = m.group(1) + m.group(2), i
        while text.rstrip().endswith("\\") and j + 1 < len(lines):  # continuation lines
            j += 1
            text = text.rstrip()[:-1] + " " + lines[j].strip()
        text = re.sub(r"\s\(trimmed\).*$", "", text.split(" # ")[0]).strip()
        if "..." in text or "<" in text:  # a placeholder, not a command
            continue
        refusal = None
        for k in range(j + 1, len(lines)):
            nxt = lines[k].strip()
            if FENCE.match(nxt) or COMMAND.match(nxt) or nxt.startswith("$ "):
                break
            if nxt.startswith("error:"):
                refusal = re.sub(r"\s+", " ", nxt[len("error:"):]).strip()[:40]
                break
        try:
            argv = ["-m", *shlex.split(text)]
        except ValueError:
            continue
        out.append(Command(page.name, i + 1, argv, refusal))
    return out


def unavailable(cmd: Command) -> str | None:
    """Why this machine cannot run ``cmd`` as written, or None."""
    text = " ".join(cmd.argv)
    if "--backend=nccl" in text or "--backend nccl" in text:
        try:
            import torch

            if not torch.cuda.is_available():
                return "needs a GPU (NCCL)"
        except ImportError:
            return "needs torch"
    if "--sweep-backend ray" in text and importlib.util.find_spec("ray") is None:
        return "needs ray (pip install -e .[ray])"
    return None


TINY_FABRIC = ("kind: fabric\nname: gloo-x\ntopology: switch\nbandwidth_GBps: 1.0e-300\nefficiency: 1.0\n"
               "base_latency_us: 50.0\nhop_latency_us: 20.0\n")


def _user_files(cwd: Path) -> None:
    (cwd / "mine" / "checkpoints").mkdir(parents=True)
    (cwd / "mine" / "checkpoints" / "notes.txt").write_text("a user's file\n")


def _finished_run(cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "oresearcher.run", "--scenario", "scenarios/local-gloo.yaml", "--steps", "12",
                    "--set", "training.lr=0.1", "--out", "runs/x", "--no-tensorboard", "--no-progress"],
                   cwd=cwd, capture_output=True, check=True)


# (page, a piece of the command) -> what the page describes in words before it
SETUPS = {
    ("scenarios.md", "oresearcher.sim bad.yaml"): lambda cwd: (cwd / "bad.yaml").write_text(BAD_YAML),
    ("real-runs-safety.md", "--out mine --overwrite"): _user_files,
    ("real-runs-safety.md", "profile_files=[prof.yaml]"): lambda cwd: (cwd / "scenarios" / "prof.yaml").write_text(
        TINY_FABRIC),
    ("real-runs.md", "--resume runs/x --lr=0.5"): _finished_run,
}


def setup(cmd: Command, cwd: Path) -> None:
    text = " ".join(cmd.argv)
    for (page, piece), make in SETUPS.items():
        if cmd.page == page and piece in text:
            make(cwd)


def workdir(base: Path, page: str) -> Path:
    d = base / page.replace(".md", "")
    d.mkdir(parents=True)
    shutil.copytree(ROOT / "scenarios", d / "scenarios")
    shutil.copytree(ROOT / "tests" / "data", d / "tests" / "data")
    return d


def run(cmd: Command, cwd: Path, timeout: float) -> tuple[str, float, str]:
    """(verdict, seconds, what to show) of one command."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, *cmd.argv], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return "TIMEOUT", time.perf_counter() - t0, f"still running after {timeout:.0f} s"
    dt = time.perf_counter() - t0
    err = [line for line in p.stderr.splitlines() if line.strip()]
    last = err[-1] if err else ""
    if cmd.refusal is None:
        return ("ok" if p.returncode == 0 else f"FAIL rc={p.returncode}"), dt, last[:160]
    good = p.returncode == 2 and last.startswith("error:") and last[len("error:"):].strip().startswith(cmd.refusal)
    return ("ok (refused)" if good else f"FAIL rc={p.returncode}"), dt, last[:160]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", help="comma-separated page names (README.md, cli.md, ...); default all")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one command may take (default 600)")
    ap.add_argument("--list", action="store_true", help="list the commands and run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the working directories (their path is printed)")
    args = ap.parse_args(argv)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if args.pages:
        wanted = set(args.pages.split(","))
        unknown = wanted - {p.name for p in pages}
        if unknown:
            print(f"error: no such page: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        pages = [p for p in pages if p.name in wanted]
    todo = [(p, commands(p)) for p in pages]
    if args.list:
        for p, cmds in todo:
            for c in cmds:
                print(f"{c.page}:{c.line}  {'refusal  ' if c.refusal else 'works    '}{c.text}")
        return 0
    base = Path(tempfile.mkdtemp(prefix="walkthrough-"))
    failed, total, t_all = 0, 0, time.perf_counter()
    try:
        for page, cmds in todo:
            if not cmds:
                continue
            cwd = workdir(base, page.name)
            seen = set()
            for c in cmds:
                total += 1
                why = unavailable(c) or ("shown again with its output: run above" if c.refusal is None
                                         and tuple(c.argv) in seen else None)
                seen.add(tuple(c.argv))
                if why:
                    print(f"{c.page}:{c.line:<4} {'skipped':<14} {'':>7}  {c.text[:100]}  ({why})", flush=True)
                    continue
                setup(c, cwd)
                verdict, dt, shown = run(c, cwd, args.timeout)
                failed += not verdict.startswith("ok")
                print(f"{c.page}:{c.line:<4} {verdict:<14} {dt:6.1f}s  {c.text[:100]}"
                      + (f"\n      {shown}" if not verdict.startswith("ok") else ""), flush=True)
    finally:
        if args.keep:
            print(f"working directories kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(f"{total} commands, {failed} not as documented, {time.perf_counter() - t_all:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
