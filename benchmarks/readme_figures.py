"""Regenerate the figures of README.md and the docs/ pages from fresh runs, in place, so they
cannot drift.

    python benchmarks/readme_figures.py                  # every block: run, rewrite the pages
    python benchmarks/readme_figures.py --quick          # only the quick blocks (seconds each)
    python benchmarks/readme_figures.py --check --quick  # what CI runs: exit 1 with a diff on drift
    python benchmarks/readme_figures.py --only sim-8xA100
    python benchmarks/readme_figures.py --list

A figure in README.md or in a page docs/*.md (``pages()``) sits between two HTML comments,
invisible on GitHub and in the docs site:

    <!-- fig:NAME -->
    ...what the generator printed...
    <!-- /fig:NAME -->

Each NAME appears once over all the pages and has a generator (``BLOCKS``, in
readme_blocks.py): it runs the command the page shows (a subprocess in the repository root,
100 columns, one thread) or calls the benchmark's function, and returns the text between
the markers. Only the text inside markers is replaced, and each page is read again just
before it is written, so edits elsewhere in the file (by hand, at the same time) survive. A block marked non-quick takes minutes
(``--list`` says which); ``--check`` without ``--quick`` runs them too. Blocks with
``images`` also copy the figure the run drew into docs/img/ (not in ``--check``).

Figures that are wall-clock measurements of this machine (codec, simulator and replay
speeds, sim-to-real, bench_gpu, the outputs of real gloo runs) move from run to run, and
the multi-minute accuracy benchmarks (cooperation, privacy, replay, finance) are left to
their own commands; neither is regenerated here, and the page names the command beside
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
DOCS = ROOT / "docs"
# a marker is a line of its own (the README may mention `<!-- fig:NAME -->` in prose)
MARK = re.compile(r"^<!-- fig:([\w.-]+) -->\n(.*?)^<!-- /fig:\1 -->$", re.S | re.M)
OPEN = re.compile(r"^<!-- fig:([\w.-]+) -->$", re.M)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_blocks import BLOCKS, Block  # noqa: E402


# ---- the pages ---------------------------------------------------------------------------
def pages() -> list[Path]:
    """The files that may hold blocks: README.md, then every docs/*.md in name order."""
    return [README, *sorted(DOCS.glob("*.md"))]


def _label(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def blocks_in(text: str, label: str = "README.md") -> dict[str, str]:
    """NAME -> the text between its markers."""
    found = {}
    for m in MARK.finditer(text):
        if m.group(1) in found:
            raise ValueError(f"{label}: fig:{m.group(1)} appears twice")
        found[m.group(1)] = m.group(2)
    opened = set(OPEN.findall(text))
    if opened - set(found):
        raise ValueError(f"{label}: fig:{sorted(opened - set(found))[0]} has no matching <!-- /fig:... --> line")
    return found


def where(files: list[Path] | None = None) -> dict[str, Path]:
    """NAME -> the page that holds its block; a NAME on two pages is an error."""
    found: dict[str, Path] = {}
    for page in files if files is not None else pages():
        for name in blocks_in(page.read_text(), _label(page)):
            if name in found:
                raise ValueError(f"fig:{name} appears in both {_label(found[name])} and {_label(page)}")
            found[name] = page
    return found


def all_blocks(files: list[Path] | None = None) -> dict[str, str]:
    """NAME -> its text, over every page."""
    texts = {}
    for name, page in where(files).items():
        texts[name] = blocks_in(page.read_text(), _label(page))[name]
    return texts


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


def diff(old: str, new: str, name: str, label: str = "README.md") -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{label} fig:{name}",
                                        f"fresh fig:{name}"))


def check(blocks: list[Block], log=print, files: list[Path] | None = None) -> list[str]:
    """The diff of every block whose page text differs from a fresh run (empty: all match)."""
    at = where(files)
    missing = [b.name for b in blocks if b.name not in at]
    if missing:
        raise SystemExit(f"error: no page (README.md, docs/*.md) has a <!-- fig:{missing[0]} --> block")
    present = all_blocks(files)
    fresh = regenerate(blocks, log)
    return [diff(present[n], t, n, _label(at[n])) for n, t in fresh.items() if present[n] != t]


def write(blocks: list[Block], log=print, failed: list | None = None, files: list[Path] | None = None) -> list[str]:
    """Regenerate ``blocks`` and rewrite their text in the pages that hold them; returns the names
    that changed."""
    where(files)  # fail before minutes of work on a broken page
    fresh = regenerate(blocks, log, failed)
    for b in blocks:
        for src, dst in b.images.items():
            if (ROOT / src).is_file():
                shutil.copyfile(ROOT / src, ROOT / dst)
    at = where(files)  # fresh: others may have edited or moved sections meanwhile
    for n in fresh:
        if n not in at:
            log(f"warning: no page has a <!-- fig:{n} --> block; {n} not written")
    changed = []
    for page in sorted({at[n] for n in fresh if n in at}):
        text = page.read_text()
        present = blocks_in(text, _label(page))
        mine = {n: t for n, t in fresh.items() if n in present}
        changed += [n for n, t in mine.items() if present[n] != t]
        from oresearcher.files import write_text

        write_text(page, replace(text, mine))  # atomic, never through a link
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/readme_figures.py", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate into memory; exit 1 with a diff if a page differs")
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
        print(f"{len(diffs)} of {len(blocks)} figure blocks differ from a fresh run" if diffs
              else f"all {len(blocks)} figure blocks match a fresh run", file=sys.stderr)
        return 1 if diffs else 0
    failed: list[str] = []
    changed = write(blocks, log, failed)
    names = f" ({', '.join(changed)})" if changed else ""
    print(f"{len(changed)} of {len(blocks)} figure blocks changed{names}")
    if failed:
        print(f"error: {len(failed)} block(s) failed and were left as they were: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
