"""The house's shape, checked: rooms import downwards only, no import cycle between files
or rooms (lazy imports inside functions count), few top-level modules, no long library
module. The import graph is read from the source (ast), so the test needs nothing built.

Rooms from the bottom up (a room may import its own files and any room below it):
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the package's directories: oresearcher/, and sim/ and backends/ installed as its sub-packages
DIRS = {"oresearcher": "oresearcher", "sim": "oresearcher.sim", "backends": "oresearcher.backends"}
LAYERS = [
    {"errors"},
    {"ops", "seeds", "files", "yamlsafe", "testing", "strict"},  # the ops, their reference interpreter, small helpers
    {"comm"},  # the cost of moving bytes: units, schedules, topology, the alpha-beta and NCCL tiers
    {"hardware"},  # device and fabric profiles
    {"models"},  # networks, their learners and measured costs
    {"codecs"},
    {"tasks"},  # what agents train on: data, models, learners, rewards, export
    {"strategies"},  # what each training.strategy is, declared (its program is named, imported on first use)
    {"scenario"},  # the validated description of a run
    {"cooperation"},  # the mechanisms between agents
    {"programs"},  # agent programs: generators of ops
    {"reporting"},
    {"sim"},  # interprets programs in simulated time
    {"experiments"},  # equal-compute experiments: strategies compared, mechanisms ablated, in simulation
    {"calibration"},  # fits profiles to measurements
    {"backends"},  # interprets programs on torch.distributed
    {"run", "calibrate", "compare", "export"},  # the entry points
]
LEVEL = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
MAX_TOP_LEVEL = 12
MAX_LINES = 400


def modules() -> dict[str, Path]:
    out = {}
    for d, pkg in DIRS.items():
        for p in (ROOT / d).rglob("*.py"):
            rel = p.relative_to(ROOT / d).with_suffix("").parts
            parts = [x for x in rel if x != "__init__"]
            out[".".join([pkg, *parts])] = p
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports (module level or inside functions)."""
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        is_pkg = p.name == "__init__.py"
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = m.split(".") if is_pkg else m.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in names:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and not m.startswith(t + "."):  # a module's own package: already running
                    edges[m].add(t)
    return edges


def room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


MODS = modules()
EDGES = imports(MODS)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]; counter[0] += 1; stack.append(start); on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_room_has_a_layer():
    rooms = {room(m) for m in MODS} - {""}
    assert rooms - set(LEVEL) == set(), "a new room or top-level module: give it a layer in LAYERS"


def test_imports_run_downwards_only():
    wrong = sorted(f"{a} -> {b}" for a, bs in EDGES.items() for b in bs
                   if room(a) and room(b) and room(a) != room(b) and LEVEL[room(a)] < LEVEL[room(b)])
    assert wrong == [], "an import from a lower room to a higher one:\n" + "\n".join(wrong)


def test_no_import_cycle_between_files_or_rooms():
    assert cycles(EDGES) == []
    rooms = {}
    for a, bs in EDGES.items():
        for b in bs:
            if room(a) != room(b):
                rooms.setdefault(room(a), set()).add(room(b))
    assert cycles(rooms) == []


# the backends' own rooms, bottom up (docs/design.md, "The backends' rooms")
BACKEND_ROOMS = ["checkpoint", "fsdp", "run", "calibration"]


def backend_room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "backends" else ""


def test_backend_rooms_import_downwards_only():
    """checkpoint <- fsdp <- run <- calibration; every backends module sits in one of them."""
    mods = [m for m in MODS if room(m) == "backends" and m != "oresearcher.backends"]
    assert {backend_room(m) for m in mods} - {""} == set(BACKEND_ROOMS)
    assert all(backend_room(m) or MODS[m].name == "__init__.py" for m in mods), "a flat file in backends/: give it a room"
    level = {r: i for i, r in enumerate(BACKEND_ROOMS)}
    wrong = sorted(f"{a} -> {b}" for a in mods for b in EDGES[a]
                   if backend_room(a) and backend_room(b) and level[backend_room(a)] < level[backend_room(b)])
    assert wrong == [], "an import from a lower backends room to a higher one:\n" + "\n".join(wrong)


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a two-file and a three-file cycle are found, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_few_top_level_modules():
    top = sorted(p.name for p in (ROOT / "oresearcher").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


@pytest.mark.parametrize("module", sorted(MODS))
def test_no_long_library_module(module):
    lines = MODS[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{MODS[module].relative_to(ROOT)}: {lines} lines; split it by what its parts do"


UNITS = {"GB", "MB", "KB", "GiB", "MiB", "KiB", "US", "MS", "NS"}  # names of unit constants


def test_unit_constants_are_defined_once():
    """A unit (GB = 10^9 bytes, US = 10^-6 s) has one definition the package imports: two
    could disagree (10^9 against 2^30 bytes) without any test noticing."""
    where: dict[str, list[str]] = {}
    for m, p in MODS.items():
        for node in ast.parse(p.read_text(), str(p)).body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id in UNITS:
                    where.setdefault(t.id, []).append(m)
    twice = {name: ms for name, ms in where.items() if len(ms) > 1}
    assert twice == {}, f"import these from one module: {twice}"
