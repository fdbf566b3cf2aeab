"""The strict pydantic base and the number types that refuse true/false: what every
validated section shares, the scenario's (:mod:`oresearcher.scenario.types`) and a task's
own options (:mod:`oresearcher.tasks.text.options`), declared below both."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _not_bool(v):
    if isinstance(v, bool):  # YAML's true is an int to pydantic; a count of true is a mistake
        raise ValueError("expected a number, not true/false")
    return v


Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
