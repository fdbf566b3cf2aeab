"""The compliance agent: a rule engine that scores every proposed credit decision.

Rules are data (``finance.rules`` in the scenario, :class:`Rule` here). Two kinds:

- ``max_ratio``: approving an applicant whose ``feature`` (a raw, unscaled ratio such as
  the payment-to-income ratio ``pirat``) is above ``limit`` is a breach. Denying is
  always compliant.
- ``protected``: the decision must not depend on a 0/1 protected attribute (race,
  marital status, sex): the engine asks the model again with the attribute flipped
  (``1 - x``) and any decision that changes is a breach, approval or denial alike
  (a counterfactual test in the sense of Kusner et al., "Counterfactual Fairness",
  NeurIPS 2017, restricted to the attribute itself).

Each decision's compliance score is the fraction of applicable rules it satisfies, in
[0, 1]; its mean over a split is the agent's safety reward (the validators' ``safety``
column). A breach of a ``hard`` rule vetoes the decision: the application is referred,
not approved, so a vetoed approval becomes a denial and a veto never turns a denial into
an approval. Soft rules only lower the score. A rule whose feature a dataset lacks does
not apply to it.

Pure functions over tensors; ``decide(X) -> bool [N]`` is the model being checked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class Rule:
    kind: str  # "max_ratio" | "protected"
    feature: str
    limit: float | None = None  # max_ratio only: the largest allowed value
    hard: bool = True

    @classmethod
    def from_spec(cls, spec) -> "Rule":
        return cls(spec.kind, spec.feature, spec.limit, spec.hard)


@dataclass
class Review:
    """The engine's verdict on N proposed decisions (all tensors [N])."""

    proposed: torch.Tensor  # bool, the model's approvals
    approve: torch.Tensor  # bool, after vetoes
    score: torch.Tensor  # float64 in [0, 1]
    veto: torch.Tensor  # bool
    breaches: dict = field(default_factory=dict)  # "kind:feature" -> number of breaching decisions

    @property
    def safety(self) -> float:
        """Mean compliance score: the safety reward."""
        return float(self.score.mean()) if self.score.numel() else 1.0


def applicable(rules: Sequence[Rule], features: Sequence[str], raw: dict) -> list[Rule]:
    """The rules a dataset can be checked against (protected: a model input; ratio: a raw column)."""
    return [r for r in rules if (r.feature in features if r.kind == "protected" else r.feature in raw)]


def review(rules: Sequence[Rule], decide: Callable[[torch.Tensor], torch.Tensor], X: torch.Tensor,
           raw: dict, features: Sequence[str]) -> Review:
    """Score and veto ``decide(X)``: X [N, F] model inputs (0/1 protected columns),
    ``raw`` {feature: [N]} unscaled rule features, ``features`` the column names of X."""
    proposed = decide(X).bool()
    n = proposed.shape[0]
    active = applicable(rules, features, raw)
    breached = torch.zeros(n, dtype=torch.float64)
    veto = torch.zeros(n, dtype=torch.bool)
    counts = {}
    for rule in active:
        if rule.kind == "max_ratio":
            hit = proposed & (raw[rule.feature].to(torch.float64) > rule.limit)
        elif rule.kind == "protected":
            j = list(features).index(rule.feature)
            flipped = X.clone()
            flipped[:, j] = 1 - flipped[:, j]
            hit = decide(flipped).bool() != proposed
        else:
            raise ValueError(f"unknown rule kind {rule.kind!r}")
        counts[f"{rule.kind}:{rule.feature}"] = int(hit.sum())
        breached += hit.double()
        if rule.hard:
            veto |= hit
    score = 1.0 - breached / max(1, len(active))
    return Review(proposed, proposed & ~veto, score, veto, counts)


def decision_rates(approve: torch.Tensor, y: torch.Tensor) -> dict:
    """accuracy, false approvals (approved, label deny) and false denials (denied, label
    approve) as fractions of all N decisions; misjudgement = their sum."""
    approve, good = approve.bool(), y.bool()
    n = max(1, approve.numel())
    fa = float((approve & ~good).sum()) / n
    fd = float((~approve & good).sum()) / n
    return {"accuracy": 1.0 - fa - fd, "false_approval": fa, "false_denial": fd, "misjudgement": fa + fd}


def fairness_gap(approve: torch.Tensor, group: torch.Tensor) -> float:
    """|approval rate(group 1) - approval rate(group 0)| (demographic parity difference);
    nan when a group is empty."""
    g = group.bool()
    if g.all() or not g.any():
        return float("nan")
    a = approve.double()
    return abs(float(a[g].mean()) - float(a[~g].mean()))
