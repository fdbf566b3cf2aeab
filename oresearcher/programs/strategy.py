"""The strategy objects as the programs room names them: :class:`Strategy`,
:func:`get_strategy`, :func:`register_strategy`. They are declared one room down, in
:mod:`oresearcher.strategies` (the scenario resolves them at load, and it sits below the
programs); this module is where a program's author finds them beside the programs."""
from ..strategies import FlagUse, Strategy, get_strategy, register_strategy, unregister_strategy  # noqa: F401
