"""Every `python -m oresearcher.sim` and `python -m oresearcher.run` command the README and
the docs pages show is checked against the code, so the pages cannot drift from it:

- a command shown with its refusal (a `$ command` line whose next output line starts with
  `error:`) is run, and must exit 2 with that error's first words as its last line;
- every other command must parse, pass the command line's own checks, and load its
  scenario with its overrides (each value of a sweep too). It is not run: most are
  minutes of training; tests/sim/test_cli.py runs every scenario file for a few steps.

Commands that continue a run made earlier on the page (`--resume DIR`), refusals that need
a setup the page describes in words (NEEDS_SETUP), and lines with `...` placeholders are
left out.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from oresearcher.errors import UserError, cli_main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(\$ )?python -m oresearcher\.(sim|run)\b(.*)$")
FENCE = re.compile(r"^```")


# Refusals shown after a setup the page describes in words (a directory holding a user's
# files, a profile file written first): the command alone would not refuse.
NEEDS_SETUP = {
    "real-runs-safety.md": ("--out mine --overwrite", "cluster.profile_files=[prof.yaml]"),
    "scenarios.md": ("bad.yaml",),
}


def documented_commands() -> list[tuple[str, str, list[str], str | None]]:
    """(where, cli, argv, expected error prefix or None) for each command on the pages. In a
    code block, a `$ command` line's output runs to the next `$` line or the block's end;
    the command is a refusal when that output holds an `error:` line and the `$` command
    before it in the block (if any) was one too (otherwise it may depend on that one)."""
    found = []
    for page in PAGES:
        lines, in_block, prev_refused = page.read_text().splitlines(), False, True
        for i, raw in enumerate(lines):
            if FENCE.match(raw.strip()):
                in_block, prev_refused = not in_block, True
                continue
            m = COMMAND.match(raw.strip()) if in_block else None
            if not m:
                continue
            text, j = m.group(3), i
            while text.rstrip().endswith("\\") and j + 1 < len(lines):  # continuation lines
                j += 1
                text = text.rstrip()[:-1] + " " + lines[j].strip()
            text = re.sub(r"\s\(trimmed\).*$", "", text.split(" # ")[0])
            text = re.sub(r"\[[^\]]*\]$", "", text.strip()).strip()  # an optional part, usage style
            out = []
            for k in range(j + 1, len(lines)):
                if lines[k].startswith("$ ") or FENCE.match(lines[k].strip()):
                    break
                out.append(lines[k].strip())
            errors = [o for o in out if o.startswith("error: ")] if m.group(1) else []
            refused, follows = bool(errors), prev_refused
            prev_refused = refused if m.group(1) else prev_refused
            if "..." in text or "--resume" in text:
                continue
            if refused and (not follows or any(t in text for t in NEEDS_SETUP.get(page.name, ()))):
                continue
            expect = errors[-1][len("error: "):][:40] if refused else None
            found.append((f"{page.name}:{i + 1}", m.group(2), shlex.split(text), expect))
    return found


COMMANDS = documented_commands()


def test_the_pages_show_commands_of_both_kinds():
    assert sum(c[3] is None for c in COMMANDS) >= 20, "fewer documented commands than the pages hold"
    assert sum(c[3] is not None for c in COMMANDS) >= 5, "no documented refusal found"


def _parse_and_load(cli: str, argv: list[str]) -> None:
    if cli == "sim":
        from oresearcher.scenario import load_scenario
        from oresearcher.scenario.shipped import find_scenario
        from oresearcher.sim.__main__ import check_flags, parse_args

        args = parse_args(argv)
        check_flags(args)
        path = str(find_scenario(args.scenario))
        if args.collective_bench:
            load_scenario(path, args.set)
            return
        sets = list(args.set) + ([f"convergence.target_loss={args.target_loss!r}"] if args.target_loss else [])
        field, _, values = (args.sweep or "").partition("=")
        for value in (values.split(",") if args.sweep else [None]):
            load_scenario(path, sets + ([f"{field}={value}"] if value is not None else []))
    else:
        from oresearcher.backends.run.flags import build_parser, load

        load(build_parser().parse_args(argv))


@pytest.mark.parametrize("where,cli,argv", [c[:3] for c in COMMANDS if c[3] is None], ids=lambda v: str(v)[:60])
def test_a_documented_command_parses_and_loads(where, cli, argv, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    if "--out" not in argv and cli == "run":
        argv = [*argv, "--out", str(tmp_path / "out")]  # the default directory may hold a run already
    try:
        _parse_and_load(cli, argv)
    except UserError as e:
        pytest.fail(f"{where}: python -m oresearcher.{cli} {shlex.join(argv)}: {e}")
    except SystemExit as e:  # argparse
        pytest.fail(f"{where}: python -m oresearcher.{cli} {shlex.join(argv)}: argparse exit {e.code}")


@pytest.mark.parametrize("where,cli,argv,expect", [c for c in COMMANDS if c[3] is not None],
                         ids=lambda v: str(v)[:60])
def test_a_documented_refusal_is_that_one_line_and_exit_2(where, cli, argv, expect, monkeypatch, tmp_path, capsys):
    if cli == "sim":
        from oresearcher.sim.__main__ import main
    else:
        from oresearcher.run import main
    # from a directory of its own, which sees the repository's scenarios and data: a
    # command that wrongly succeeds writes its default runs/ there, never in the checkout
    for name in ("scenarios", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    code = cli_main(main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, f"{where}: exit {code}, stderr {err[-3:]}"
    assert err and err[-1].startswith("error: " + expect), f"{where}: {err[-1:]!r} does not start with {expect!r}"
