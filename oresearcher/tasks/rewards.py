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

In supervised tasks the scheduled weights also shape the training loss
(:func:`shaped_loss`): cross-entropy for the task metric, confident wrong-answer mass for
the safety rule, and a peer term: by default agreement with the peers' mean prediction
(co-distillation), optionally the novelty reward's stand-in (total variation to the
peers' mean prediction, which pushes agents apart).
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
    # shares first: give * w / rest underflows to 0 when rest is subnormal, losing weight
    return w_base + give * (w_base / rest), new_nov, w_safe + give * (w_safe / rest)


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


def loss_coefficients(weights: Sequence[float]) -> tuple[float, float]:
    """(lambda_novelty, lambda_safety) of :func:`shaped_loss` for reward weights (w_b, w_n, w_s).

    The weights are divided by w_base so cross-entropy keeps unit weight (the learning
    rate means what it meant without shaping), and each ratio is capped at 1 so the task
    term stays the dominant one: lambda = min(1, w / w_base) (1 if w_base = 0 and w > 0).
    """
    w_base, w_nov, w_safe = (float(w) for w in weights)
    ratio = lambda w: 0.0 if w <= 0.0 else (1.0 if w_base <= 0.0 else min(1.0, w / w_base))  # noqa: E731
    return ratio(w_nov), ratio(w_safe)


def soft_overconfident_error(probs: torch.Tensor, labels: torch.Tensor, threshold: float = 0.9) -> torch.Tensor:
    """Differentiable stand-in for :func:`overconfident_error_safety`, in [0, 1].

    Mean over the batch of ``relu(max_{c != y} p_c - threshold) / (1 - threshold)``: the
    probability a wrong class holds beyond the rule's confidence threshold. It is > 0 on
    exactly the samples the rule calls unsafe (a wrong class above the threshold is the
    argmax), and 0 elsewhere.
    """
    # scatter, not one_hot: one_hot checks label values (.item()), which torch.func.vmap forbids
    # (oresearcher.cooperation.privacy differentiates this per sample)
    true = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, labels.unsqueeze(-1), True)
    wrong = probs.masked_fill(true, 0.0)
    return ((wrong.max(-1).values - threshold).clamp(min=0.0) / (1.0 - threshold)).mean()


PEER_TERMS = ("agreement", "diversity", "none")


def agreement_weight(weight: float, progress: float, schedule: str) -> float:
    """The agreement term's weight at training progress p: ``weight * g(p)`` (g :func:`ramp`),
    small while the agents are still far from any useful consensus and full at the end,
    like co-distillation's burn-in before the distillation term is switched on (Anil et
    al., "Large scale distributed neural network training through online distillation",
    2018)."""
    return float(weight) * ramp(progress, schedule)


def agreement_loss(logits: torch.Tensor, peer_probs: torch.Tensor) -> torch.Tensor:
    """KL(p_bar || p), batch mean: cross-entropy to the peers' (stale) ensemble prediction
    less its constant entropy. Its gradient in the logits is (p - p_bar) / B, so a descent
    step moves the agent's prediction toward the peers' mean (co-distillation)."""
    log_p = torch.nn.functional.log_softmax(logits.float(), -1)
    q = peer_probs.float()
    return (q * (q.clamp_min(1e-30).log() - log_p)).sum(-1).mean()


def shaped_loss(logits: torch.Tensor, labels: torch.Tensor, peer_probs: torch.Tensor | None,
                weights: Sequence[float] | None, peer_term: str = "diversity",
                agreement: float = 0.0) -> torch.Tensor:
    """Loss of one supervised agent: the negated reward, with differentiable terms.

        L = CE(p, y) + peer term + lambda_s * S(p, y)

    p = softmax(logits); p_bar ([B, C], no gradient) the mean prediction of the frozen peer
    ensemble on the same batch; S :func:`soft_overconfident_error`; lambdas from
    :func:`loss_coefficients` of the scheduled weights. The peer term (``peer_term``):

    - "agreement": ``+ agreement * KL(p_bar || p)`` (:func:`agreement_loss`), pulling each
      agent toward its peers' prediction (co-distillation, Anil et al. 2018);
    - "diversity": ``- lambda_n * TV(p, p_bar)`` (TV as :func:`tv_novelty`), rewarding
      disagreement with the others' ensemble (negative correlation learning, Liu & Yao,
      "Ensemble learning via negative correlation", Neural Networks 1999);
    - "none": no peer term.

    Without peers (no fusion round yet, one agent, shaping switched off) or weights, or
    with zero peer and safety weights, it is plain cross-entropy.
    """
    if peer_term not in PEER_TERMS:
        raise ValueError(f"unknown peer term {peer_term!r}; known: {', '.join(PEER_TERMS)}")
    ce = torch.nn.functional.cross_entropy(logits, labels)
    if weights is None or peer_probs is None:
        return ce
    lam_n, lam_s = loss_coefficients(weights)
    lam_n = lam_n if peer_term == "diversity" else 0.0
    probs = logits.float().softmax(-1) if lam_n or lam_s else None
    loss = ce
    if peer_term == "agreement" and agreement:
        loss = loss + agreement * agreement_loss(logits, peer_probs).to(ce.dtype)
    if lam_n:
        loss = loss - lam_n * tv_novelty(probs, peer_probs.float()).to(ce.dtype)
    if lam_s:
        loss = loss + lam_s * soft_overconfident_error(probs, labels).to(ce.dtype)
    return loss


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
