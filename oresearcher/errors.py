"""User-facing errors and the thin wrapper every entry point's ``main()`` goes through.

A :class:`UserError` is a mistake in what the user typed or wrote (a bad flag, a bad
scenario file). Entry points print it as one line on stderr and exit with code 2; no
traceback. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import logging
import reprlib
import sys
from typing import Any, Callable

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 80
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 6
_short.maxlevel = 2

SHOWN = 200  # at most this many characters of a user's value in any message


def short(value: Any, limit: int = SHOWN) -> str:
    """A bounded repr of ``value`` for one-line messages: reprlib never expands a huge or
    deeply shared value (a YAML alias bomb) in full, and the result is cut at ``limit``."""
    text = _short.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class UserError(Exception):
    """One line that tells the user what to fix; exit code 2."""


class Parser(argparse.ArgumentParser):
    """The entry points' argument parser: flag mistakes are user errors, one line and exit
    code 2 through :func:`cli_main`, not argparse's usage block."""

    def error(self, message):
        raise UserError(f"{message[:300]} (see --help)")


NOTICES = "oresearcher.tasks"  # the loggers whose INFO lines every command shows: a task preparing its
# data or its base (minutes of work a user should see start and end)


def cli_main(main: Callable[[list[str] | None], int | None], argv=None) -> int:
    """Run ``main(argv)``; turn UserError into one stderr line and exit code 2. Logging, where
    the command has not set it up itself: warnings and the tasks' notices (:data:`NOTICES`),
    each as its bare message on stderr."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger(NOTICES).setLevel(logging.INFO)
    try:
        return int(main(argv) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
