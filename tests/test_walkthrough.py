"""The newcomer's walk-through (benchmarks/walkthrough.py): every command the README and
the docs pages show, run as written in a directory of its own, exits as the page says.
The whole walk takes about half an hour on two cores (docs/testing.md has its last
result); here it lists every page's commands and walks one page end to end."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "walkthrough.py"


def walk(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_the_list_holds_every_page_and_tells_refusals_from_working_commands():
    p = walk("--list")
    assert p.returncode == 0, p.stderr
    rows = p.stdout.splitlines()
    pages = {r.split(":")[0] for r in rows}
    assert {"README.md", "cli.md", "real-runs.md", "simulator.md", "finance.md"} <= pages
    assert any(r.startswith("README.md:") and "works" in r and "oresearcher.sim scenarios/8xA100.yaml" in r
               for r in rows)
    assert any("refusal" in r and "--set training.stpes=3" in r for r in rows)  # the typo the CLI page shows
    assert all(" python -m oresearcher." in r for r in rows)


def test_a_page_walked_end_to_end_exits_as_documented():
    """scenarios.md: two simulations that work and two refusals (one after the setup the
    page describes in words: a bad.yaml of its own)."""
    p = walk("--pages", "scenarios.md")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok (refused)" in p.stdout and p.stdout.count("\nscenarios.md:") + p.stdout.startswith("scenarios.md:") >= 4
    assert ", 0 not as documented," in p.stdout


def test_an_unknown_page_is_one_line_and_exit_2():
    p = walk("--pages", "nope.md")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "nope.md" in p.stderr
