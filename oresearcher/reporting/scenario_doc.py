"""The scenario reference page, written from the schema itself so it cannot drift from the code.

    python -m oresearcher.reporting.scenario_doc           # rewrite docs/scenario-reference.md
    python -m oresearcher.reporting.scenario_doc --check   # exit 1 if the checked-in page differs

Every section of :class:`oresearcher.scenario.Scenario` becomes a table: each field's YAML
key, its type and range (read from the pydantic annotations: ``ge``/``gt``/``le``/``lt``,
lengths, literal choices), its default and its ``description``. A section's docstring, when
it has one, opens its table. ``tests/reporting/test_scenario_doc.py`` fails when the checked-in page
differs from what this module renders, so a field added, renamed or re-described without
regenerating the page is caught in CI.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ..scenario.types import TASK_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "scenario-reference.md"

HEADER = """# Scenario reference

Generated from the schema's field descriptions (`oresearcher/scenario/schema.py` and the sections
it assembles) by `python -m oresearcher.reporting.scenario_doc`; do not edit by hand:
`tests/reporting/test_scenario_doc.py` fails when this page and the code disagree. How scenario files
are read, overridden and checked: [Scenario files](scenarios.md).

Every section is optional; a missing field takes its default. Unknown keys are errors, and
so are `true`/`false` where a number is expected. Units are in the field names (`_MB` is
10^6 bytes, `_GBps` 10^9 bytes/s, `_s` seconds, `_us` microseconds).
"""


def _models(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (a section, an optional one, a list of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models(a)]


def _bounds(metadata) -> str:
    """'>= 1, <= 16384' from the annotated_types constraints of a field or a type argument."""
    words = []
    for m in metadata:
        if isinstance(m, FieldInfo):  # Annotated[X, Field(ge=...)] inside a tuple or a list
            words += [w for w in [_bounds(m.metadata)] if w]
            continue
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                words.append(f"{sign} {v:g}" if isinstance(v, float) else f"{sign} {v}")
        for attr, what in (("min_length", "length >="), ("max_length", "length <=")):
            v = getattr(m, attr, None)
            if v is not None:
                words.append(f"{what} {v}")
    return ", ".join(words)


def type_name(annotation) -> str:
    """A reader's name for a field's type: 'integer', 'one of: a, b', 'list of text', ..."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of: " + ", ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        inner = " or ".join(type_name(a) for a in kept)
        return f"{inner} or null" if len(kept) < len(args) else inner
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is tuple:
        return f"list of {len(args)}: " + ", ".join(type_name(a) for a in args)
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if origin is Annotated:  # Annotated[X, constraints...]
        inner, bounds = type_name(args[0]), _bounds(annotation.__metadata__)
        return f"{inner} ({bounds})" if bounds else inner
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    names = {int: "integer", float: "number", bool: "true/false", str: "text", Path: "path", Any: "codec spec"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, tuple):
        value = list(value)
    try:
        return f"`{json.dumps(value)}`"
    except TypeError:
        return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def section(path: str, model: type[BaseModel]) -> list[str]:
    """The Markdown of one section: heading, docstring, one table row per field."""
    lines = [f"## `{path}`" if path else "## Top level", ""]
    doc = model.__doc__
    if doc and doc != BaseModel.__doc__ and not doc.startswith(f"{model.__name__}("):
        lines += [" ".join(inspect.cleandoc(doc).split()), ""]
    lines += ["| field | type and range | default | what it is |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        kind = TASK_OPTIONS if TASK_OPTIONS in field.metadata else type_name(field.annotation)
        bounds = _bounds(field.metadata)
        if bounds:
            kind = f"{kind} ({bounds})"
        if _models(field.annotation):
            target = f"{path}.{name}" if path else name
            kind = f"{kind} (see `{target}`)"
        lines.append(f"| `{name}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(field.description or '')} |")
    return lines + [""]


def render() -> str:
    """The whole page: the top level, then every section depth-first in declaration order."""
    from oresearcher.scenario import Scenario

    out, seen = [HEADER], set()

    def walk(path: str, model: type[BaseModel]) -> None:
        out.extend(section(path, model))
        for name, field in model.model_fields.items():
            for sub in _models(field.annotation):
                key = (f"{path}.{name}" if path else name, sub)
                if key not in seen:
                    seen.add(key)
                    walk(key[0], sub)

    walk("", Scenario)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oresearcher.reporting.scenario_doc", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page differs from the schema")
    ap.add_argument("--out", type=Path, default=PAGE, help=f"the page (default {PAGE.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        old = args.out.read_text() if args.out.is_file() else ""
        if old != text:
            print(f"{args.out}: differs from the schema; run python -m oresearcher.reporting.scenario_doc",
                  file=sys.stderr)
            return 1
        print(f"{args.out}: matches the schema", file=sys.stderr)
        return 0
    from ..files import write_text

    write_text(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
