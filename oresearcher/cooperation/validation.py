"""Who scores what: validators split the held-out data into disjoint shards.

Several validators scoring every agent on the same split compute the same numbers
(deterministic evaluation): redundant work that looks like independent evidence. So:

- a learner that can predict on given inputs (``task_data(split)`` and
  ``predict_params(flat, arch, X)``, the hooks the trained ensemble uses) is scored by
  each of ``V`` validators on its own shard of the validation split (rows ``v, v+V,
  v+2V, ...``: disjoint, together the whole split), and the published score is the mean
  over validators, as before;
- otherwise (tasks without those hooks, or with the trained ensemble, whose novelty is
  fitted on the whole split) one validator, the lowest-ranked, scores; the others report
  nothing (decode_reports averages only the validators that reported).

Scoring is held to a fixed share of the compute (``cooperation.roles.validation_share``):
each round the validators score a seeded subsample of the split whose size makes their
evaluations cost that share of the round's training FLOPs (:func:`subsample_size`), not
the whole split every round, where the split is large next to the training a round does.
A learner that cannot predict on given inputs but scores given rows of each
architecture's own split (``evaluate_params(flat, arch, rows)`` with ``val_size(arch)``,
as finance) is scored by one validator on a subsample per agent of the same cost.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..tasks.rewards import overconfident_error_safety


def validator_slot(roles, rank: int) -> tuple[int, int]:
    """(v, V): this rank's index among the validators, and how many there are."""
    vals = [i for i, r in enumerate(roles) if r == "validator"]
    return (vals.index(rank) if rank in vals else -1), len(vals)


def can_shard(learner) -> bool:
    return learner.task_data is not None and learner.predict_params is not None


def shard_rows(total: int, v: int, count: int) -> torch.Tensor:
    """Rows of validator ``v`` of ``count``: disjoint across validators, covering all."""
    return torch.arange(total)[v::count]


MIN_ROWS = 32  # a subsample never smaller (unless the split is): an accuracy from fewer is noise


def subsample_size(total: int, budget_flops: float, per_sample_flops: float, agents: int,
                   floor: int = MIN_ROWS) -> int:
    """Rows the validators score each agent on so that scoring all ``agents`` costs
    ``budget_flops`` (a share of the round's training FLOPs): floor(budget / (agents *
    per-sample FLOPs)), at least ``floor`` (:data:`MIN_ROWS`), at most the whole split."""
    if per_sample_flops <= 0 or agents <= 0:
        return total
    return max(min(total, floor), min(total, int(budget_flops // (agents * per_sample_flops))))


def subsample_rows(total: int, size: int, seed: int) -> torch.Tensor:
    """A seeded subset of ``size`` of ``total`` rows (sorted): the same on every rank for
    one round (all agents scored on the same rows), another each round."""
    if size >= total:
        return torch.arange(total)
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(total, generator=g)[:size].sort().values


def shard_scores(learner, flat: torch.Tensor, arch: str, v: int, count: int, rows=None) -> dict:
    """One agent on validator ``v``'s shard of ``rows`` (default: the whole validation
    split): the keys of ``evaluate_params``."""
    from ..tasks.supervised import expected_calibration_error

    X, y = learner.task_data("val")
    rows = (torch.arange(len(y)) if rows is None else rows)[v::count]
    logits, flops = learner.predict_params(flat, arch, X[rows])
    y = y[rows].cpu()
    probs = logits.softmax(-1)
    if not bool(torch.isfinite(logits).all()):
        nan = float("nan")
        return {"metric": nan, "loss": nan, "calibration": nan, "safety": 0.0, "probs": probs, "flops": flops}
    return {"metric": float((logits.argmax(-1) == y).float().mean()), "loss": float(F.cross_entropy(logits, y)),
            "calibration": expected_calibration_error(probs, y), "safety": overconfident_error_safety(probs, y),
            "probs": probs, "flops": flops}
