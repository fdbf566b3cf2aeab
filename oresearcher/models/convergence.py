"""Where the loss gets: a scaling law for the base run and measured strategy efficiency.

Pure math over numbers and lists; :mod:`oresearcher.sim.convergence` runs the proxies
and assembles the report section.

**Base run.** Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models",
arXiv 2203.15556), Approach 3, eq. (2) and section 3.3: the final loss of a model of N
parameters trained on D tokens is

    L(N, D) = E + A / N^alpha + B / D^beta

with the fit E = 1.69, A = 406.4, B = 410.7, alpha = 0.34, beta = 0.28. N counts every
parameter, embeddings included (the Chinchilla convention; Kaplan et al. 2020 count
non-embedding parameters, which Pearce and Song 2024, arXiv 2406.12907, show is what
separates the two laws). Two of the paper's own configurations, by hand from the printed
constants (ln = natural log):

- Chinchilla, N = 70e9, D = 1.4e12: 406.4 / exp(0.34 ln 70e9) = 406.4 / 4867.8 = 0.08349;
  410.7 / exp(0.28 ln 1.4e12) = 410.7 / 2517.2 = 0.16316; L = 1.69 + 0.0835 + 0.1632 = 1.937.
- Gopher, N = 280e9, D = 300e9: 406.4 / 7798.9 = 0.05211; 410.7 / 1635.3 = 0.25115;
  L = 1.993 (above Chinchilla's, the paper's point: the smaller model on more tokens wins).

**Strategy efficiency.** A strategy other than synchronous data parallel (the regime the
law was fitted in) learns less, or more, per token. It is measured, not assumed: the same
program runs in numeric mode on a small proxy beside synchronous data parallel, and
the ratio of the steps each needs to reach the same loss is an effective-token multiplier
m (:func:`multiplier`); at scale the strategy's loss is L(N, m D). The loss curve of a
run is the mean of its agents' training losses, smoothed; the ratio is the median over
loss levels the two curves both reach, so one noisy level does not decide it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Sequence


@dataclass(frozen=True)
class ScalingLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta (losses in nats per token)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str = ""


# Hoffmann et al. 2022, arXiv 2203.15556, section 3.3 (Approach 3, the parametric fit):
CHINCHILLA = ScalingLaw(
    E=1.69,  # irreducible loss: "E = 1.69" (2203.15556, eq. 4 and the text above it)
    A=406.4,  # model-size coefficient: "A = 406.4" (same place)
    B=410.7,  # data coefficient: "B = 410.7" (same place)
    alpha=0.34,  # model-size exponent: "alpha = 0.34" (same place)
    beta=0.28,  # data exponent: "beta = 0.28" (same place)
    source="Hoffmann et al. 2022, arXiv 2203.15556, Approach 3",
)


def floor(law: ScalingLaw, n_params: float) -> float:
    """The loss a model of ``n_params`` parameters approaches with unlimited tokens."""
    return law.E + law.A / n_params ** law.alpha


def loss(law: ScalingLaw, n_params: float, tokens: float, multiplier: float = 1.0) -> float:
    """L(N, m D): predicted loss after ``tokens`` tokens at efficiency ``multiplier``."""
    if n_params <= 0 or multiplier <= 0:
        raise ValueError("n_params and multiplier must be positive")
    if tokens <= 0:
        return math.inf
    return floor(law, n_params) + law.B / (multiplier * tokens) ** law.beta


def tokens_to_loss(law: ScalingLaw, n_params: float, target: float, multiplier: float = 1.0) -> float:
    """Tokens until L(N, m D) reaches ``target``: (B / (target - floor))^(1/beta) / m;
    ``math.inf`` where the target is at or below the model's floor (never reached), or
    where the tokens needed pass 1e300 (a tiny beta: never, in floating point)."""
    gap = target - floor(law, n_params)
    if gap <= 0:
        return math.inf
    # with a small beta (0.001) the power overflows a float: checked in logs first, past
    # MAX_TOKENS the target is as good as never reached
    if (math.log(law.B) - math.log(gap)) / law.beta - math.log(multiplier) > math.log(MAX_TOKENS):
        return math.inf
    return (law.B / gap) ** (1.0 / law.beta) / multiplier


MAX_TOKENS = 1e300  # tokens_to_loss past this is math.inf (never, in float)


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Centred running mean over ``window`` points (odd; fewer at the ends). Centred, so a
    curve is not shifted: a trailing mean would add the same lag to both curves' steps
    and pull their ratio towards 1."""
    h = max(0, window // 2)
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for i in range(len(values)):
        lo, hi = max(0, i - h), min(len(values), i + h + 1)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def first_at_or_below(curve: Sequence[float], level: float) -> int | None:
    """1-based step at which ``curve`` first reaches ``level``; None if it never does."""
    for i, v in enumerate(curve):
        if v <= level:
            return i + 1
    return None


def levels(base: Sequence[float], other: Sequence[float], count: int = 16, skip: float = 0.1) -> list[float]:
    """``count`` loss levels both curves reach, evenly spaced from the base curve's value
    ``skip`` of the way into the run (past the first steps, where every run falls alike
    from log V) down to just above the higher of the two minima."""
    hi = base[min(len(base) - 1, int(skip * len(base)))]
    lo = max(min(base), min(other))
    if hi <= lo:
        return []
    lo += 0.05 * (hi - lo)  # keep off the minima themselves, where noise decides the step
    return [hi - (hi - lo) * k / (count - 1) for k in range(count)]


def step_ratio(base: Sequence[float], other: Sequence[float], level: float) -> float | None:
    """steps(base) / steps(other) to ``level``; None where either curve never gets there."""
    sb, so = first_at_or_below(base, level), first_at_or_below(other, level)
    return sb / so if sb is not None and so is not None else None


def level_ratios(base: Sequence[float], other: Sequence[float], count: int = 16) -> list[tuple[float, float]]:
    """(level, steps(base) / steps(other)) at each of :func:`levels` both curves reach."""
    ratios = ((level, step_ratio(base, other, level)) for level in levels(base, other, count))
    return [(level, r) for level, r in ratios if r is not None]


def multiplier(base: Sequence[float], other: Sequence[float], count: int = 16) -> float | None:
    """Effective-token multiplier of ``other`` against ``base`` (loss per step, equal tokens
    per step): the median over shared loss levels of steps(base) / steps(other). Above 1:
    ``other`` gets there in fewer steps. None when the curves share no level."""
    ratios = [r for _, r in level_ratios(base, other, count)]
    return median(ratios) if ratios else None


# The largest model-to-proxy size ratio a multiplier has been checked across: the held-out
# model of benchmarks/bench_convergence.py (gpt-tiny, 858,880 parameters) over the proxy
# (gpt-proxy, 132,864). Past it the report says the multiplier is the proxy's.
CHECKED_SIZE_RATIO = 6.5


@dataclass(frozen=True)
class Efficiency:
    """A strategy's multiplier: the median over seeds, with the seeds' range as its band."""

    multiplier: float
    low: float
    high: float
    per_seed: tuple[float, ...]

    @classmethod
    def of(cls, per_seed: Sequence[float]) -> "Efficiency":
        if not per_seed:
            raise ValueError("no seed gave a multiplier")
        return cls(median(per_seed), min(per_seed), max(per_seed), tuple(per_seed))


def mean_curve(metrics: dict) -> list[float]:
    """Mean training loss over the agents at each step of a report's ``metrics`` (rank ->
    rows with ``step`` and ``loss``); steps an agent sat out, or with no finite loss, skipped."""
    by_step: dict[int, list[float]] = {}
    for rows in metrics.values():
        for row in rows:
            v = row.get("loss")
            if v is not None and math.isfinite(v):
                by_step.setdefault(row["step"], []).append(v)
    return [sum(v) / len(v) for _, v in sorted(by_step.items())]


def fit_data_term(tokens: Sequence[float], losses: Sequence[float]) -> tuple[float, float, float]:
    """(c, B, beta) of L(D) = c + B / D^beta fitted to a measured curve: least squares of
    ln(L - c) on ln D for each c on a grid below the curve's minimum, the c with the
    smallest residual kept. The form a user's own fit of the law takes at one model size
    (E absorbs A / N^alpha)."""
    lo = min(losses)
    best = None
    for k in range(1, 200):
        c = lo * (1 - k / 200)
        xs = [math.log(t) for t in tokens]
        ys = [math.log(v - c) for v in losses]
        n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        icpt = my - slope * mx
        res = sum((y - icpt - slope * x) ** 2 for x, y in zip(xs, ys)) / n
        if best is None or res < best[0]:
            best = (res, c, math.exp(icpt), -slope)
    _, c, b, beta = best
    return c, b, beta
