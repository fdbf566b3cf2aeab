"""Reading a scenario: the YAML file (budgeted safe loader), ``--set`` overrides, validation
against :mod:`oresearcher.scenario.schema`, and one-line errors naming file, field and value."""
from __future__ import annotations

import copy
import difflib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .. import yamlsafe
from ..errors import UserError, short
from .cluster import check_profiles
from .schema import Scenario


def parse_override(text: str, flag: str = "--set") -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a","b","c"], value parsed as YAML)."""
    if "=" not in text:
        raise UserError(f"{flag} {short(text)}: expected path.to.field=value")
    path, raw = text.split("=", 1)
    if not path.strip() or any(not k for k in path.strip().split(".")):
        raise UserError(f"{flag} {short(text)}: empty field path")
    try:
        value = yamlsafe.parse(raw, flag) if raw.strip() else ""
    except UserError:
        value = raw  # not YAML: the text itself (the field's validator judges it)
    return path.strip().split("."), value


def apply_override(data: dict, path: list[str], value: Any, label: str) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise UserError(f"{label}: {short('.'.join(path))}: {short(key)} is not a section")
        node = child
    node[path[-1]] = value


def _model_of(annotation) -> type[BaseModel] | None:
    """The section model inside a field's annotation (``Optional[RoleMix]`` -> RoleMix)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model_of, typing.get_args(annotation))), None)


def did_you_mean(loc: tuple) -> str:
    """``; did you mean training.steps?`` for an unknown key at ``loc``: the closest field
    of the section it sits in (difflib's ratio >= 0.6), or '' when none is close."""
    model = Scenario
    for key in loc[:-1]:
        field = model.model_fields.get(str(key))
        model = field and _model_of(field.annotation)
        if model is None:
            return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?" if close else ""


def as_set(text: str) -> str:
    """How an override is named in a message: as the user typed it (at most 120 characters)."""
    return "--set " + (text if len(text) <= 120 else text[:117] + "...")


def blame(source: str, err: ValidationError, overrides=(), labels=None, file_alone_valid=None,
          valid_without=None) -> str:
    """Whom an error names: the ``--set`` (or flag) that wrote the bad field; for an error
    across fields that the file alone does not have, the overrides; else the file.
    Several ``--set`` under the failing section (``workload.options.corpus=x`` and
    ``workload.options.cache_dir=y`` for an error at ``workload.options``): the one without
    which the scenario validates (``valid_without(text)``), else the last applied."""
    label = (labels or {}).get
    loc = ".".join(str(p) for p in err.errors()[0]["loc"])
    keys = [(t, t.split("=", 1)[0].strip()) for t in overrides]
    hit = [t for t, k in keys if loc and (loc == k or loc.startswith(k + ".") or k.startswith(loc + "."))]
    if len(hit) > 1 and valid_without is not None:
        hit = [t for t in hit if valid_without(t)][-1:] or hit
    if hit:  # the last one applied is the value that failed
        return label(hit[-1]) or as_set(hit[-1])
    if overrides and file_alone_valid is not None and file_alone_valid():
        shown = [label(t) or as_set(t) for t in overrides[:3]]
        return " ".join(shown) + (" ..." if len(overrides) > 3 else "")
    return source


def _format_error(source: str, err: ValidationError) -> str:
    e = err.errors()[0]
    loc = short(".".join(str(p) for p in e["loc"]), 120).strip("'")
    msg = e["msg"].removeprefix("Value error, ")[:300]
    if e["type"] == "extra_forbidden":
        msg += did_you_mean(e["loc"])
    got = e.get("input")
    shown = "" if isinstance(got, dict) else f" (got {short(got)})"
    more = len(err.errors()) - 1
    tail = f"; and {more} more error{'s' if more > 1 else ''}" if more else ""
    return f"{source}: {loc + ': ' if loc else ''}{msg}{shown}{tail}"  # a check across fields names them


def validate(data: Any, source: str, overrides=(), labels=None, base: Any = None) -> Scenario:
    """The Scenario of ``data``; UserError naming ``source``, or the override that made the
    bad value (``base``: the data before ``overrides`` were applied)."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        ok = None if base is None else lambda: _valid(base)
        without = None if base is None else lambda t: _valid_without(base, overrides, t)
        raise UserError(_format_error(blame(source, e, list(overrides), labels, ok, without), e)) from None


def _valid_without(base, overrides, text: str) -> bool:
    """Whether ``base`` with every override but ``text`` applied validates."""
    try:
        return _valid(overridden(base, [o for o in overrides if o != text]))
    except UserError:  # a later override needed the section this one wrote
        return False


def _valid(data) -> bool:
    try:
        Scenario.model_validate(data)
        return True
    except ValidationError:
        return False


def read_yaml(path: str | Path) -> Any:
    """The parsed document of a scenario file (:func:`oresearcher.yamlsafe.read`)."""
    return yamlsafe.read(path)


def load_raw(path: str | Path, overrides: list[str] = ()) -> dict:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return overridden(data, overrides)


def overridden(data: dict, overrides: list[str], label: str | None = None) -> dict:
    """A copy of the raw mapping ``data`` with the ``field=value`` overrides applied; an
    override that cannot apply names ``label``, by default itself (``--set TEXT``)."""
    data = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        apply_override(data, keys, value, label or as_set(text))
    return data


def load_scenario(path: str | Path, overrides: list[str] = (), labels: dict[str, str] | None = None) -> Scenario:
    """Read, override and validate one scenario file, the cluster's device and fabric
    names included (:func:`oresearcher.scenario.cluster.check_profiles`); UserError on any problem.
    An error that an override made names the override (``labels``: override text -> the
    flag the user typed, default ``--set TEXT``), not the file."""
    raw = load_raw(path)
    scenario = validate(overridden(raw, overrides), str(path), overrides, labels, raw)
    scenario._source = Path(path)
    check_profiles(scenario.cluster, str(path), scenario_dir(scenario), who=lambda f: _writer(f, overrides, labels))
    return scenario


def _writer(field: str, overrides, labels=None) -> str | None:
    """The override (as the user typed it) that last wrote ``field``, or None."""
    hit = [t for t in overrides if field == (k := t.split("=", 1)[0].strip()) or field.startswith(k + ".")]
    return ((labels or {}).get(hit[-1]) or as_set(hit[-1])) if hit else None


def check_resize(scenario: Scenario, overrides=(), labels=None) -> None:
    """An override of the cluster's size (``cluster.nodes``, ``cluster.gpus_per_node``)
    without one of ``agents.count``: one agent runs per GPU, so agents that stayed at the
    file's count would answer for the old cluster. Refused unless they agree. The command
    lines call it on what the user typed; code that builds scenarios (benchmarks placing
    4 agents on an 8-GPU node) states its agents.count or means the file's."""
    keys = {t.split("=", 1)[0].strip(): t for t in overrides}
    sized = [keys[k] for k in ("cluster.nodes", "cluster.gpus_per_node") if k in keys]
    world, count = scenario.cluster.world_size, scenario.agents.count
    if not sized or "agents.count" in keys or "agents" in keys or count == world:
        return
    name = (labels or {}).get(sized[-1]) or as_set(sized[-1])
    raise UserError(f"{name}: the cluster has {world} GPUs but agents.count stays {count} (one agent per "
                    f"GPU); add --set agents.count={world}, or --set agents.count={count} to keep it on purpose")


def scenario_dir(scenario: Scenario) -> Path:
    """Directory that relative paths in the scenario are resolved against."""
    src = getattr(scenario, "_source", None)
    return Path(src).parent if src else Path(".")


def output_dir(root: str | Path, *parts: str) -> Path:
    """``root/parts...``, checked to stay under ``root`` once resolved (symlinks and ``..``
    included); a scenario name is a slug, so a default output directory never leaves it."""
    base = Path(root).resolve()
    if not base.joinpath(*parts).resolve().is_relative_to(base):
        raise UserError(f"output directory {short(str(Path(root, *parts)))} leaves {root}/")
    return Path(root, *parts)
