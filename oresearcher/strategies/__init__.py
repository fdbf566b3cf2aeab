"""Training strategies, each declared once (:class:`~oresearcher.strategies.spec.Strategy`).

``STRATEGIES`` lists where the shipped ones live, one line each; a module declares
``STRATEGY = Strategy(...)`` and is imported the first time its name is asked for.
:func:`register_strategy` adds one from outside the package (a plug-in, a test's toy).
The scenario resolves ``training.strategy`` with :func:`get_strategy` at load and hands
the object on as ``scenario.strategy``; nothing else looks strategies up by name.
"""
from __future__ import annotations

import importlib

from .spec import FlagUse, Strategy  # noqa: F401

# training.strategy -> the module that declares its STRATEGY, in the order messages list them
STRATEGIES = {
    "oresearcher": "oresearcher.strategies.cooperative",
    "ddp": "oresearcher.strategies.ddp",
    "local_sgd": "oresearcher.strategies.local_sgd",
    "diloco": "oresearcher.strategies.diloco",
    "single": "oresearcher.strategies.single",
    "fsdp": "oresearcher.strategies.fsdp",
}
_registered: dict[str, Strategy] = {}  # declared outside the package, by register_strategy


def names() -> tuple[str, ...]:
    """Every strategy's name: the shipped ones, then the registered ones."""
    return (*STRATEGIES, *(n for n in _registered if n not in STRATEGIES))


def find_strategy(name) -> Strategy | None:
    """The strategy called ``name``, or None for a name nobody declared (an old report's)."""
    if not isinstance(name, str):
        return None
    if name in _registered:
        return _registered[name]
    if name in STRATEGIES:
        return importlib.import_module(STRATEGIES[name]).STRATEGY
    return None


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; ValueError naming the known ones otherwise."""
    found = find_strategy(name)
    if found is None:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(names())}")
    return found


def all_strategies() -> list[Strategy]:
    return [get_strategy(n) for n in names()]


def register_strategy(strategy: Strategy) -> Strategy:
    """Make ``strategy`` known by its name (scenarios may then name it); a shipped name is refused."""
    if strategy.name in STRATEGIES:
        raise ValueError(f"strategy {strategy.name!r} is shipped; give yours another name")
    _registered[strategy.name] = strategy
    return strategy


def unregister_strategy(name: str) -> None:
    """Forget a strategy :func:`register_strategy` added (a test's toy, after the test)."""
    _registered.pop(name, None)
