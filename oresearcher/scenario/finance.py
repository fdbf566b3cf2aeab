"""The scenario's ``finance:`` section: the compliance agent's rules, as data
(:mod:`oresearcher.tasks.finance_compliance` scores decisions against them)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from .types import Float, Name, Strict


class ComplianceRuleSpec(Strict):
    """One rule of the finance task's compliance engine (oresearcher.tasks.finance_compliance)."""

    kind: Literal["max_ratio", "protected"] = Field(
        description="max_ratio: approving above `limit` is a breach; protected: flipping this 0/1 input "
                    "must not change the decision")
    feature: Name = Field(description="the column checked, e.g. pirat (payment-to-income), afam, married")
    limit: Optional[Float] = Field(None, gt=0, le=1e6, description="max_ratio: the largest allowed value (ratio)")
    hard: bool = Field(True, description="a breach vetoes the decision (else it only lowers the compliance score)")

    @model_validator(mode="after")
    def _limit(self):
        if (self.kind == "max_ratio") != (self.limit is not None):
            raise ValueError("limit is required by kind max_ratio and only by it")
        return self


class FinanceSpec(Strict):
    """The finance case study (workload.task = finance): the compliance agent's rules, as data."""

    rules: list[ComplianceRuleSpec] = Field(default_factory=list, max_length=64,
                                            description="rules every proposed credit decision is scored against")
