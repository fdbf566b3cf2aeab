"""Strategies and tasks are declared objects, not strings compared where a decision is
made: no module but a strategy's own (oresearcher/strategies/<it>.py) compares
``training.strategy`` with a strategy's name, and none but a task's own module or folder
compares ``workload.task`` with a task's name. The rest ask the declaration
(``scenario.strategy.shares_model``, ``scenario.task.shape_mode``). Read from the source (ast)."""
from __future__ import annotations

import ast
from pathlib import Path

from oresearcher.strategies import STRATEGIES
from oresearcher.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
DIRS = ("oresearcher", "sim", "backends")


def _own_files(modules: dict[str, str]) -> dict[str, Path]:
    """name -> the file (or folder) that declares it."""
    out = {}
    for name, module in modules.items():
        path = ROOT / Path(*module.split("."))
        out[name] = path if path.is_dir() else path.with_suffix(".py")
    return out


def _literals(node) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _identifiers(node) -> set[str]:
    return {n.attr if isinstance(n, ast.Attribute) else n.id
            for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Name))}


def comparisons(source: str, names: set[str], word: str) -> list[int]:
    """Lines of ``source`` that compare something called ``word`` with one of ``names``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if set().union(*map(_literals, sides)) & names and word in set().union(*map(_identifiers, sides)):
                lines.append(node.lineno)
    return lines


def offenders(names: dict[str, str], word: str) -> list[str]:
    own = _own_files(names)
    found = []
    for d in DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            for line in comparisons(path.read_text(), set(names), word):
                text = path.read_text().splitlines()[line - 1]
                mine = [n for n, f in own.items() if (path == f or f in path.parents) and f'"{n}"' in text]
                if not mine:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {text.strip()}")
    return found


def test_no_strategy_name_is_compared_outside_its_own_module():
    assert offenders(STRATEGIES, "strategy") == [], "ask scenario.strategy (a declared Strategy) instead"


def test_no_task_name_is_compared_outside_its_own_module():
    assert offenders(TASKS, "task") == [], "ask scenario.task (a declared Task) instead"


def test_the_walker_finds_a_comparison_and_passes_a_question():
    """The checks above can fail: the comparisons the house had are found, the questions it asks now are not."""
    names = set(STRATEGIES)
    assert comparisons('if scenario.training.strategy == "fsdp":\n    pass\n', names, "strategy") == [1]
    assert comparisons('x = t.strategy in ("local_sgd", "diloco")\n', names, "strategy") == [1]
    assert comparisons('ok = w.task != "synthetic-lm"\n', set(TASKS), "task") == [1]
    assert comparisons("if scenario.strategy.shares_model:\n    pass\n", names, "strategy") == []
    assert comparisons('if sc.fsdp.replicas == "fusion":\n    pass\n', names, "strategy") == []
