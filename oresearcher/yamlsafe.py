"""YAML for input that a user (or an attacker) wrote: yaml.SafeLoader plus budgets.

SafeLoader already refuses tags that build Python objects. What it allows is still
enough to hurt: a few hundred bytes of nested aliases expand to gigabytes once anything
walks the result ("billion laughs"), 100k nested brackets overflow the recursion of the
composer, a duplicate key silently keeps the last value, and an empty file reads as
nothing at all. So a document is refused, with a :class:`UserError` naming the file and
the line, when it

- is larger than ``MAX_BYTES`` or empty;
- uses more than ``MAX_ALIASES`` aliases (``*name``), or nests deeper than ``MAX_DEPTH``;
- repeats a key within one mapping (merge keys ``<<`` may still be overridden).

Scenario files are a few kB, with a handful of anchors at most, nested five deep.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import UserError, short

MAX_BYTES = 256 * 1024
MAX_ALIASES = 8
MAX_DEPTH = 32


class _Refused(yaml.MarkedYAMLError):
    pass


class BudgetLoader(yaml.SafeLoader):
    """yaml.SafeLoader with an alias budget, a depth cap and no duplicate keys."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(problem=f"more than {MAX_ALIASES} aliases (*name)",
                               problem_mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(problem=f"nested deeper than {MAX_DEPTH} levels",
                               problem_mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # unhashable: SafeConstructor names it below
                    continue
                if dup:
                    raise _Refused(problem=f"duplicate key {short(key)}", problem_mark=key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def parse(text: str, source: str) -> Any:
    """Parse one YAML document under the budgets; UserError (one line) on any problem."""
    if len(text) > MAX_BYTES:
        raise UserError(f"{source}: {len(text)} characters; a scenario is at most {MAX_BYTES} bytes")
    try:
        return yaml.load(text, Loader=BudgetLoader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        kind = "refused" if isinstance(e, (_Refused, yaml.constructor.ConstructorError)) else "YAML syntax error"
        raise UserError(f"{source}:{where} {kind}: {problem[:200]}") from None
    except RecursionError:
        raise UserError(f"{source}: nested too deeply") from None


def _text(p: Path, what: str) -> str:
    """The UTF-8 text of file ``p`` (``what`` it holds, for the size error), at most MAX_BYTES."""
    if not p.is_file():
        raise UserError(f"{str(p)[:200]}: no such file")
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise UserError(f"{p}: {size} bytes; {what} is at most {MAX_BYTES} bytes")
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read: {short(str(e))}") from None


def read(path: str | Path) -> Any:
    """Read and parse a YAML file; an empty document is an error."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{str(p)[:200]}: a directory, not a YAML file (a scenario is one file, "
                        f"e.g. scenarios/8xA100.yaml)")
    data = parse(_text(p, "a scenario"), str(p))
    if data is None:
        raise UserError(f"{p}: empty; a scenario needs at least its sections (see scenarios/)")
    return data


def read_all(path: str | Path, what: str = "a profile file") -> list:
    """Every document of a multi-document YAML file (device and fabric profiles), under
    the same budgets as a scenario: size, aliases and depth counted over the whole file,
    no duplicate keys. Empty documents are dropped."""
    p = Path(path)
    text = _text(p, what)
    try:
        return [d for d in yaml.load_all(text, Loader=BudgetLoader) if d is not None]  # noqa: S506
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        kind = "refused" if isinstance(e, (_Refused, yaml.constructor.ConstructorError)) else "YAML syntax error"
        raise UserError(f"{p}:{where} {kind}: {problem[:200]}") from None
    except RecursionError:
        raise UserError(f"{p}: nested too deeply") from None
