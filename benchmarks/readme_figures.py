"""Regenerate the README's figures from fresh runs, in place, so they cannot drift.

    python benchmarks/readme_figures.py                  # every block: run, rewrite README.md
    python benchmarks/readme_figures.py --quick          # only the quick blocks (seconds each)
    python benchmarks/readme_figures.py --check --quick  # what CI runs: exit 1 with a diff on drift
    python benchmarks/readme_figures.py --only sim-8xA100
    python benchmarks/readme_figures.py --list

A figure in README.md sits between two HTML comments, invisible on GitHub:

    <!-- fig:NAME -->
    ...what the generator printed...
    <!-- /fig:NAME -->

Each NAME has a generator below (``BLOCKS``): it runs the command the README shows (a
subprocess in the repository root, 100 columns, one thread) or calls the benchmark's
function, and returns the text between the markers. Only the text inside markers is
replaced, and README.md is read again just before it is written, so edits elsewhere in
the file (by hand, at the same time) survive. A block marked non-quick takes minutes
(``--list`` says which); ``--check`` without ``--quick`` runs them too. Blocks with
``images`` also copy the figure the run drew into docs/img/ (not in ``--check``).

Figures that are wall-clock measurements of this machine (codec, simulator and replay
speeds, sim-to-real, bench_gpu, the outputs of real gloo runs) move from run to run, and
the multi-minute accuracy benchmarks (cooperation, privacy, replay, finance) are left to
their own commands; neither is regenerated here, and the README names the command beside
each of them.
"""
from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# a marker is a line of its own (the README may mention `<!-- fig:NAME -->` in prose)
MARK = re.compile(r"^<!-- fig:([\w.-]+) -->\n(.*?)^<!-- /fig:\1 -->$", re.S | re.M)
OPEN = re.compile(r"^<!-- fig:([\w.-]+) -->$", re.M)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_blocks import BLOCKS, Block  # noqa: E402


# ---- the README -------------------------------------------------------------------------
def blocks_in(text: str) -> dict[str, str]:
    """NAME -> the text between its markers."""
    found = {}
    for m in MARK.finditer(text):
        if m.group(1) in found:
            raise ValueError(f"README.md: fig:{m.group(1)} appears twice")
        found[m.group(1)] = m.group(2)
    opened = set(OPEN.findall(text))
    if opened - set(found):
        raise ValueError(f"README.md: fig:{sorted(opened - set(found))[0]} has no matching <!-- /fig:... --> line")
    return found


def replace(text: str, new: dict[str, str]) -> str:
    """``text`` with the inside of each named block replaced; nothing outside markers moves."""
    return MARK.sub(lambda m: f"<!-- fig:{m.group(1)} -->\n{new.get(m.group(1), m.group(2))}<!-- /fig:{m.group(1)} -->",
                    text)


def select(names, quick: bool) -> list[Block]:
    known = {b.name: b for b in BLOCKS}
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"error: --only {unknown[0]}: no such block (known: {', '.join(known)})")
        return [known[n] for n in names]
    return [b for b in BLOCKS if b.quick or not quick]


def regenerate(blocks: list[Block], log=print, failed: list | None = None) -> dict[str, str]:
    """NAME -> fresh text. A block whose generator fails is logged and left out (its name
    goes to ``failed``), so one broken command does not cost the others' minutes."""
    new = {}
    for b in blocks:
        log(f"regenerating {b.name}: {b.command}")
        try:
            new[b.name] = b.generate()
        except Exception as e:  # noqa: BLE001 -- reported, and the run exits 1
            log(f"error: {b.name}: {type(e).__name__}: {e}")
            if failed is None:
                raise
            failed.append(b.name)
    return new


def diff(old: str, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"README.md fig:{name}",
                                        f"fresh fig:{name}"))


def check(blocks: list[Block], log=print) -> list[str]:
    """The diff of every block whose README text differs from a fresh run (empty: all match)."""
    present = blocks_in(README.read_text())
    missing = [b.name for b in blocks if b.name not in present]
    if missing:
        raise SystemExit(f"error: README.md has no <!-- fig:{missing[0]} --> block")
    fresh = regenerate(blocks, log)
    return [diff(present[n], t, n) for n, t in fresh.items() if present[n] != t]


def write(blocks: list[Block], log=print, failed: list | None = None) -> list[str]:
    """Regenerate ``blocks`` and rewrite their README text; returns the names that changed."""
    blocks_in(README.read_text())  # fail before minutes of work on a broken README
    fresh = regenerate(blocks, log, failed)
    for b in blocks:
        for src, dst in b.images.items():
            if (ROOT / src).is_file():
                shutil.copyfile(ROOT / src, ROOT / dst)
    text = README.read_text()  # fresh: others may have edited other sections meanwhile
    present = blocks_in(text)
    changed = [n for n, t in fresh.items() if n in present and present[n] != t]
    skipped = [n for n in fresh if n not in present]
    for n in skipped:
        log(f"warning: README.md has no <!-- fig:{n} --> block; {n} not written")
    tmp = README.with_suffix(".md.tmp")
    tmp.write_text(replace(text, fresh))
    tmp.replace(README)
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/readme_figures.py", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate into memory; exit 1 with a diff if README differs")
    ap.add_argument("--quick", action="store_true", help="only the blocks that take seconds (--list marks them)")
    ap.add_argument("--only", action="append", metavar="NAME", help="one block (repeatable); see --list")
    ap.add_argument("--list", action="store_true", help="list the blocks, their commands and whether they are quick")
    args = ap.parse_args(argv)
    if args.list:
        for b in BLOCKS:
            print(f"{b.name:18} {'quick' if b.quick else 'slow ':5}  {b.command}")
        return 0
    blocks = select(args.only, args.quick)
    log = (lambda s: print(s, file=sys.stderr, flush=True))
    if args.check:
        diffs = check(blocks, log)
        for d in diffs:
            print(d)
        print(f"{len(diffs)} of {len(blocks)} README blocks differ from a fresh run" if diffs
              else f"all {len(blocks)} README blocks match a fresh run", file=sys.stderr)
        return 1 if diffs else 0
    failed: list[str] = []
    changed = write(blocks, log, failed)
    names = f" ({', '.join(changed)})" if changed else ""
    print(f"README.md: {len(changed)} of {len(blocks)} blocks changed{names}")
    if failed:
        print(f"error: {len(failed)} block(s) failed and were left as they were: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
