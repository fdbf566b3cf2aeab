"""The multi-objective reward of an agent and its schedule over training.

    reward = w_base * task + w_novelty * novelty + w_safety * safety

Every term lies in [0, 1]:

- *task*: the task metric on held-out data, normalised (accuracy; return / max return).
- *novelty*: how much the agent's outputs disagree with the ensemble of the other agents
  on a fixed probe batch: the total-variation distance between its output distribution
  and the ensemble's, averaged over the batch. Rewarding it keeps the group diverse,
  the ingredient that makes ensembles and fusion beat one model (Lakshminarayanan et
  al., "Simple and Scalable Predictive Uncertainty Estimation using Deep Ensembles",
  NeurIPS 2017). In RL, :func:`count_novelty` gives a per-state count-based bonus
  (Strehl & Littman 2008; Bellemare et al., "Unifying Count-Based Exploration", 2016).
- *safety*: a pluggable rule-based compliance score (:data:`SAFETY_RULES`).

The weights follow a schedule over training progress p in [0, 1]: more novelty early
(explore), more stability late (exploit). The novelty weight is multiplied by
``1 + b * (1 - 2 g(p))``, from ``1 + b`` at p = 0 to ``1 - b`` at p = 1, with g the ramp
(linear: g = p; cosine: g = (1 - cos(pi p)) / 2; constant: g = 1/2); what novelty gains
or loses is taken from or given to the other two terms in proportion to their weights,
so the weights always add up to the same total.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

SCHEDULES = ("constant", "linear", "cosine")


def ramp(progress: float, schedule: str) -> float:
    """g(p) in [0, 1]: 0 at the start of training, 1 at the end (1/2 throughout if constant)."""
    p = min(1.0, max(0.0, float(progress)))
    if schedule == "constant":
        return 0.5
    if schedule == "linear":
        return p
    if schedule == "cosine":
        return (1.0 - math.cos(math.pi * p)) / 2.0
    raise ValueError(f"unknown reward schedule {schedule!r}; known: {', '.join(SCHEDULES)}")


def scheduled_weights(weights: Sequence[float], progress: float, schedule: str = "cosine",
                      novelty_boost: float = 0.5) -> tuple[float, float, float]:
    """(w_base, w_novelty, w_safety) at training progress ``progress`` in [0, 1].

    The sum equals ``sum(weights)`` at every p; with ``schedule="constant"`` or
    ``novelty_boost=0`` the weights are returned unchanged.
    """
    w_base, w_nov, w_safe = (float(w) for w in weights)
    if not 0.0 <= novelty_boost <= 1.0:
        raise ValueError(f"novelty_boost must be in [0, 1], got {novelty_boost}")
    rest = w_base + w_safe
    if rest <= 0.0:  # nothing to trade novelty against
        return w_base, w_nov, w_safe
    new_nov = w_nov * (1.0 + novelty_boost * (1.0 - 2.0 * ramp(progress, schedule)))
    new_nov = min(new_nov, w_nov + rest)  # never drive another weight below zero
    give = w_nov - new_nov  # what the other two terms receive (negative: they pay)
    return w_base + give * w_base / rest, new_nov, w_safe + give * w_safe / rest


def reward(task: torch.Tensor, novelty: torch.Tensor, safety: torch.Tensor,
           weights: Sequence[float]) -> torch.Tensor:
    """Elementwise weighted sum; tensors of one value per agent."""
    w_base, w_nov, w_safe = weights
    return w_base * task + w_nov * novelty + w_safe * safety


def tv_novelty(probs: torch.Tensor, ensemble: torch.Tensor) -> torch.Tensor:
    """Mean total-variation distance between rows of two [B, C] distributions, in [0, 1]."""
    return 0.5 * (probs - ensemble).abs().sum(-1).mean()


def count_novelty(counts: torch.Tensor) -> torch.Tensor:
    """Count-based state novelty 1 / sqrt(1 + n) in (0, 1] for visit counts ``n``."""
    return (1.0 + counts.to(torch.float32)).rsqrt()


# ---- safety rules: name -> fn(**evidence) -> score in [0, 1] -------------------------

def overconfident_error_safety(probs: torch.Tensor, labels: torch.Tensor, threshold: float = 0.9) -> float:
    """1 - fraction of samples classified wrongly with confidence above ``threshold``.

    A classifier that is sure and wrong is the unsafe case (Guo et al., "On Calibration
    of Modern Neural Networks", ICML 2017); unsure mistakes are tolerated.
    """
    conf, pred = probs.max(-1)
    bad = (pred != labels) & (conf > threshold)
    return 1.0 - float(bad.float().mean()) if len(labels) else 1.0


def centre_band_safety(positions: torch.Tensor, band: float = 1.2) -> float:
    """Fraction of visited states whose cart position stays within ``|x| <= band``.

    CartPole terminates at |x| > 2.4; a compliant controller stays well inside it.
    """
    if positions.numel() == 0:
        return 1.0
    return float((positions.abs() <= band).float().mean())


def finite_safety(*tensors: torch.Tensor) -> float:
    """1 if every value is finite, else 0: the minimal rule every task can use."""
    return float(all(bool(torch.isfinite(t).all()) for t in tensors))


SAFETY_RULES: dict[str, Callable[..., float]] = {
    "overconfident-errors": overconfident_error_safety,
    "centre-band": centre_band_safety,
    "finite": finite_safety,
}


def register_safety_rule(name: str, fn: Callable[..., float]) -> None:
    """Add a rule; tasks look rules up by name so new ones need no change elsewhere."""
    if name in SAFETY_RULES:
        raise ValueError(f"safety rule {name!r} already registered")
    SAFETY_RULES[name] = fn
