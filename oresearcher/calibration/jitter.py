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

def simulated_meetings(rows, rate: float, host_s: float, cv: float, world: int, rho: float = 0.0,
                       wake_s: float = 0.0, draws: int = 0, seed: int = 0) -> tuple[float, float]:
    """How the simulated ranks meet at the collectives of ``rows``
    (:func:`backends.calibration.measure.merge_waits`: the Compute ops' FLOPs between two
    collectives, and their steps): ``(spread, floor)``, means over the rows of
    ``mean_r x_r - min_r x_r`` and of ``min_r x_r``, where x_r is rank r's time in the
    collective beyond the transfer: its wait for the last arrival plus its wake-up delay.

    Each of ``world`` ranks draws its ops' durations as the simulator does: mean
    d_i = flops_i / rate + host times a lognormal factor of mean 1 and cv ``cv``, one
    per op, or with ``rho > 0`` one per step whose logarithm follows an AR(1) with lag-1
    correlation ``rho`` over the steps; and with ``wake_s > 0`` the ranks leave each
    collective in an order, the first at its end and each other an exponential draw of
    that mean less the first's later (so the next arrival starts from it too;
    sim/engine.py, ``Engine._wake``). The measured counterpart of the
    spread is each rank's time in the collective less the shortest over ranks (rows'
    ``wait_s``). Monte Carlo over ``draws`` repetitions (0: about 200,000 draws in all)
    with a fixed seed: the same inputs give the same figures."""
    flops = [r["flops"] for r in rows]
    d = np.array([f / rate + host_s for seg in flops for f in seg])
    if not rows or world < 2 or (wake_s <= 0 and (d.size == 0 or cv <= 0)):
        return 0.0, 0.0
    bounds = np.concatenate([[0], np.cumsum([len(seg) for seg in flops])]).astype(int)  # row i: ops bounds[i]:[i+1]
    draws = draws or max(8, 200_000 // (world * max(d.size, len(rows))))
    rng = np.random.default_rng(seed)
    s2 = math.log1p(cv * cv)
    if rho > 0 and d.size:
        step = np.array([t for r in rows for t in r["steps"]])
        step -= step.min()
        z = np.empty((draws, world, int(step.max()) + 1))
        z[..., 0] = rng.standard_normal((draws, world))  # stationary from the first step
        for t in range(1, z.shape[2]):
            z[..., t] = rho * z[..., t - 1] + math.sqrt(1 - rho * rho) * rng.standard_normal((draws, world))
        z = z[..., step]  # each op takes its step's factor
    else:
        z = rng.standard_normal((draws, world, d.size))
    took = d * np.exp(-s2 / 2 + math.sqrt(s2) * z)  # mean d_i: E[exp(mu + sigma z)] = 1
    total = np.concatenate([np.zeros((draws, world, 1)), np.cumsum(took, axis=2)], axis=2)
    arrive = total[..., bounds[1:]] - total[..., bounds[:-1]]  # [draws, rank, row]: time since the last meeting
    wake = rng.exponential(wake_s, (draws, world, len(rows) + 1)) if wake_s > 0 else np.zeros((1, 1, len(rows) + 1))
    wake = wake - wake.min(axis=1, keepdims=True)  # the first to wake leaves at the end, the others later
    arrive = arrive + wake[..., :-1]  # each rank starts a row when it woke from the previous collective
    x = arrive.max(axis=1, keepdims=True) - arrive + wake[..., 1:]
    low = x.min(axis=1)
    return float((x.mean(axis=1) - low).mean()), float(low.mean())

def fit_wake(rows, rate: float, host_s: float, cv: float, world: int, rho: float = 0.0) -> float:
    """The mean wake-up delay (seconds) with which the simulated ranks' times at the
    program's own collectives spread as much as the measured ones (``rows``' mean
    ``wait_s``, :func:`simulated_meetings`); 0 when the jitter alone spreads them as much,
    or nothing was measured. A rank that waits in a collective on a shared host gets its
    core back some time after the data is in, and starts the next ops that much later:
    what a spread in proportion to each op cannot give around the short ops."""
    if not rows or world < 2:
        return 0.0
    target = float(np.mean([r["wait_s"] for r in rows]))

    def spread(w):
        return simulated_meetings(rows, rate, host_s, cv, world, rho, w)[0]

    if target <= spread(0.0):
        return 0.0
    lo, hi = 0.0, target
    while spread(hi) < target and hi < 10.0:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spread(mid) < target else (lo, mid)
    return (lo + hi) / 2

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
    return scenario.strategy.sync_period(scenario)
