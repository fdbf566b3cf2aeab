"""Where a scenario file is: as given, or one of the scenarios shipped with the package.

The entry points default to ``scenarios/<name>.yaml``, a path relative to the project
root, and the README's commands name such paths. From any other directory (``cd /tmp``)
or from an installed wheel those paths do not exist, so a path that is not a file is
looked up among the shipped scenarios by its file name: ``scenarios/8xA100.yaml``,
``8xA100.yaml`` and ``8xA100`` all find it. The entry points log the file they used.

Shipped scenarios live in the source tree's ``scenarios/`` (editable installs) and in
the wheel's ``oresearcher/scenarios/`` (package data, see pyproject.toml).
"""
from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # oresearcher/
SHIPPED_DIRS = (_PACKAGE / "scenarios", _PACKAGE.parent / "scenarios")


def shipped_scenarios() -> dict[str, Path]:
    """name (file stem) -> path of every shipped scenario."""
    out: dict[str, Path] = {}
    for d in SHIPPED_DIRS:
        for p in sorted(d.glob("*.yaml")) if d.is_dir() else ():
            out.setdefault(p.stem, p)
    return out


def find_scenario(path: str | Path) -> Path:
    """``path`` if it is a file; else the shipped scenario of that name; else ``path``
    unchanged, so that loading it reports the missing file by the name the user gave."""
    p = Path(path)
    if p.is_file():
        return p
    if p.parent in (Path("."), Path("scenarios")):  # a bare name, or the README's relative path
        shipped = shipped_scenarios().get(p.stem if p.suffix in (".yaml", ".yml") else p.name)
        if shipped is not None:
            return shipped
    return p
