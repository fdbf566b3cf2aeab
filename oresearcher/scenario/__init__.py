"""Scenarios: what to run, on what, how long. The schema (:mod:`.schema` and its sections),
reading files with overrides (:mod:`.load`), and what a resumed run may change
(:mod:`.resume`). Everything above this room takes a validated :class:`Scenario`."""
from .cooperation import CooperationSpec  # noqa: F401
from .load import (  # noqa: F401
    apply_override, check_resize, load_raw, load_scenario, output_dir, overridden, parse_override, read_yaml,
    scenario_dir, validate)
from .schema import Scenario, Strict  # noqa: F401
from .types import strategy_alias_error  # noqa: F401
