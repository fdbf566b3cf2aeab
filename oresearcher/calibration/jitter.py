"""Jitter statistics of measured steps: how much ranks' step times spread (what they do not
share), how persistent a rank's slowness is over steps (AR(1) over the averaging period),
and the sync period of a scenario's program."""
from __future__ import annotations

import math

import numpy as np


def pooled_cv(step_seconds_per_rank) -> float:
    """std/mean of one step's compute time over every rank and step (grand mean).

    Pooling over ranks counts a rank that is slower for the whole run as spread too:
    which rank a shared machine slows is itself random from run to run.
    """
    xs = [x for per in step_seconds_per_rank for x in per]
    mean = float(np.mean(xs)) if xs else 0.0
    return float(np.std(xs)) / mean if mean > 0 and len(xs) > 1 else 0.0

def own_slowness(step_seconds_per_rank) -> list:
    """Each rank's per-step times without the part all ranks share.

    On a shared host ranks often slow down together (another process takes a core from
    both); that common part sets the pace, which the mean rate already holds, but makes
    no rank wait for another. Ranks wait for what differs between them, so the jitter is
    fitted to ``x[r, t] - mean_r' x[r', t]`` (steps aligned by index), scaled by
    ``sqrt(n / (n - 1))`` so its variance is one rank's own, around the grand mean. A
    rank slower for the whole run keeps its offset. Fewer than 2 ranks: nothing.
    """
    series = [np.asarray(s, dtype=float) for s in step_seconds_per_rank]
    n, steps = len(series), min((len(s) for s in series), default=0)
    if n < 2 or steps < 2:
        return []
    x = np.stack([s[:steps] for s in series])
    return list((x - x.mean(axis=0)) * math.sqrt(n / (n - 1)) + x.mean())

def op_jitter_cv(step_cv: float, op_flops, rate: float, host_s: float) -> float:
    """The per-Compute-op cv that gives a simulated step the measured spread ``step_cv``.

    The simulator scales each op of simulated duration d_i = flops_i / rate + host by an
    independent factor of cv c, so a step's std is c * sqrt(sum d_i^2) and its mean
    sum d_i; hence c = step_cv * sum d_i / sqrt(sum d_i^2) (averaged over the steps in
    ``op_flops``, a list of per-step lists of FLOPs). One dominant op gives c = step_cv.
    """
    sums, squares = [], []
    for step in op_flops:
        d = [f / rate + host_s for f in step]
        if d:
            sums.append(sum(d))
            squares.append(sum(x * x for x in d))
    if not sums or step_cv <= 0:
        return 0.0
    return float(step_cv * np.mean(sums) / np.sqrt(np.mean(squares)))

def _ratio_of_autocorrelations(r, k: int) -> float:
    """Var(sum of k consecutive steps) / (k Var(step)) for lag-j autocorrelations
    ``r[j - 1]`` (j < k): 1 + 2 sum_j (1 - j/k) r_j."""
    return 1.0 + 2.0 * sum((1 - j / k) * rj for j, rj in enumerate(r, 1))

def variance_ratio(rho: float, k: int) -> float:
    """The k-step variance ratio of an AR(1) with lag-1 correlation ``rho`` (r_j = rho^j):
    1 + 2 sum_{j<k} (1 - j/k) rho^j (1 for independent steps)."""
    return _ratio_of_autocorrelations([rho**j for j in range(1, k)], k)

def persistence_rho(step_seconds_per_rank, period: int) -> float:
    """The AR(1) lag-1 correlation whose ``period``-step variance ratio equals the
    measured one; 0 for ``period < 2``, too few steps, or no excess over independence.

    The autocorrelations r_j (j < period) are pooled over ranks around the pooled mean,
    so a rank slower for the whole run counts as persistence (it is: the others wait for
    it at every averaging). The measured ratio is 1 + 2 sum_j (1 - j/period) r_j, the
    model's :func:`variance_ratio`, which grows with rho; bisection finds rho (at most
    0.99).
    """
    if period < 2:
        return 0.0
    series = [np.asarray(s, dtype=float) for s in step_seconds_per_rank if len(s) >= 3 * period]
    if not series:
        return 0.0
    mean = float(np.mean(np.concatenate(series)))
    c = [x - mean for x in series]
    var = float(np.mean(np.concatenate(c) ** 2))
    if var <= (1e-9 * mean) ** 2:  # steady to rounding: nothing persists
        return 0.0
    r = [sum(float(x[j:] @ x[:-j]) for x in c) / sum(len(x) - j for x in c) / var for j in range(1, period)]
    target = _ratio_of_autocorrelations(r, period)
    if target <= 1.0:
        return 0.0
    lo, hi = 0.0, 0.99
    if variance_ratio(hi, period) <= target:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if variance_ratio(mid, period) < target else (lo, mid)
    return (lo + hi) / 2

def sync_period(scenario) -> int:
    """Steps between the program's averaging collectives: what rank drift builds over."""
    t, c = scenario.training, scenario.communication
    if t.strategy in ("local_sgd", "diloco"):
        return t.local_steps
    if t.strategy == "oresearcher":
        return c.share_every if c.gradient_sharing else c.interval
    return 1
