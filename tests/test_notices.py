"""Every command goes through cli_main, which shows warnings and the tasks' notices (a task
preparing its data or its base) as bare lines on stderr, and nothing quieter."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = """
import logging
from oresearcher.errors import cli_main

def main(argv):
    logging.getLogger("oresearcher.tasks.text.pretrain").info("text: pretraining the base x")
    logging.getLogger("oresearcher.tasks.text.pretrain").debug("a detail")
    logging.getLogger("oresearcher.programs.cooperative").info("a role switch")
    logging.getLogger("oresearcher.sim.simulate").warning("a warning")
    return 0

raise SystemExit(cli_main(main))
"""


def test_a_command_shows_the_tasks_notices_and_warnings_and_nothing_quieter():
    p = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == ["text: pretraining the base x", "a warning"]
    assert p.stdout == ""
