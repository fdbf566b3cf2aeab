"""Scaling laws fitted as the literature fits them: pure math over numpy arrays.

:mod:`benchmarks.bench_scaling` trains the ladder; this module turns its losses into laws.

**Size law at fixed tokens per parameter** (DiLoCo's scaling-law study, Charles et al.
2025, arXiv 2503.09799, eq. 1): ``L(N) = A N^-alpha + C``, one per strategy, N the model's
non-embedding parameters (Kaplan et al. 2020, arXiv 2001.08361).

**Chinchilla's joint form** (Hoffmann et al. 2022, arXiv 2203.15556, Approach 3):
``L(N, D) = E + A / N^alpha + B / D^beta``. Both are fitted the way Approach 3 is: a Huber
loss (delta 1e-3) between the log of the predicted and the log of the measured loss,
minimised by L-BFGS from every point of a grid of starting values, the best end point kept.
The log-sum-exp parametrisation (``A = exp(a)``, ...) keeps every coefficient positive.
Besiroglu et al. 2024 (arXiv 2404.10102) showed that a single-start fit of Approach 3
stopped short of its optimum; the grid is the guard, and :class:`Fit` says how many of the
starts reached the best objective (to 1e-9), so an unconverged fit is visible.

**Whole-curve law** (Tissue et al. 2024, "Scaling Law with Learning Rate Annealing", arXiv
2408.11029, eq. 1): the loss after step s of a run whose learning rate follows a schedule
``eta_1 .. eta_s`` is ``L(s) = L0 + A S1^-alpha - C S2`` with the forward area
``S1 = sum_{i<=s} eta_i`` and the annealing area ``S2 = sum_{i<=s} m_i``,
``m_i = lambda m_{i-1} + max(0, eta_{i-1} - eta_i)``. Warm-up is left out of S2 (only
decreases anneal, as the paper treats warm-up). The paper's lambda is 0.999 for runs of
10^4-10^5 steps, a memory of ~1,000 steps; the ladder's runs are 50-2,000 steps, and
:data:`MOMENTUM` = 0.99 keeps the memory (~100 steps) a small part of a run. Across a ladder of sizes L0 is itself the size term: :func:`fit_curves` fits
``L(N, s) = E + A_N / N^alpha_N + B S1^-beta - C S2`` to every curve of every fitted size
at once, and :func:`steps_to` reads, for a size and schedule not fitted, the first step its
predicted curve reaches a target.

**The peak rate.** In Tissue et al.'s form progress is the sum of the rates, so a run at half
the peak rate has made half the progress after the same steps. A ladder whose rate is tuned
per size reads the law at rates it was not fitted on; near the optimum, loss depends little
on the rate. :func:`at_rate` scales a schedule by ``(peak / ref)^(gamma - 1)`` before its
areas are taken: ``gamma = 1`` is the paper's form, ``gamma = 0`` counts progress in steps of
the schedule's shape at the reference rate. :func:`profile_rate` picks gamma in
:data:`RATE_EXPONENTS` by the fit's objective on runs at several peak rates (profile
likelihood; the law's other coefficients refitted at each gamma).

**Intervals**: a residual bootstrap (refit on the fitted values times resampled
multiplicative residuals; :func:`bootstrap`) gives percentile intervals. With a handful of
sizes the interval describes the scatter about the fit, not the uncertainty a larger ladder
would remove; docs/scaling.md says what the committed ladder can and cannot claim.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, section D.2: "delta = 10^-3"
MOMENTUM = 0.99  # lambda, the annealing momentum (module doc: the paper's 0.999 is for 100x longer runs)


@dataclass(frozen=True)
class Fit:
    """A fitted law: its coefficients by name, the objective, the starts that reached it."""

    form: str
    coef: dict
    objective: float
    starts: int
    converged: int  # starts whose end point is within 1e-9 of the best objective
    residuals: tuple = ()  # log(measured) - log(predicted), per point
    interval: dict = field(default_factory=dict)  # name -> (low, high), from bootstrap()

    def as_dict(self) -> dict:
        return {"form": self.form, "coef": dict(self.coef), "objective": self.objective, "starts": self.starts,
                "converged": self.converged, "residuals": list(self.residuals),
                "interval": {k: list(v) for k, v in self.interval.items()}}


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """Huber's loss of residuals ``r``: quadratic within ``delta``, linear beyond."""
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def huber_grad(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    return np.clip(r, -delta, delta)


def _lse_terms(terms: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """log(sum exp(terms)) and each term's softmax weight (the gradient's chain factor)."""
    stack = np.stack(terms)
    top = stack.max(axis=0)
    w = np.exp(stack - top)
    total = w.sum(axis=0)
    return top + np.log(total), w / total


# ---- the size law L(N) = A N^-alpha + C ----

def power_law(n, A: float, alpha: float, C: float) -> np.ndarray:
    return A * np.asarray(n, dtype=float) ** -alpha + C


def _power_obj(theta, logn, logl, delta):
    a, alpha, c = theta
    pred, w = _lse_terms([a - alpha * logn, np.full_like(logn, c)])
    r = pred - logl
    g = huber_grad(r, delta)
    grad = np.array([np.sum(g * w[0]), np.sum(g * w[0] * -logn), np.sum(g * w[1])])
    return float(np.sum(huber(r, delta))), grad


POWER_GRID = {"a": (0.0, 2.5, 5.0), "alpha": (0.1, 0.4, 0.8, 1.5), "c": (-1.0, 0.5, 1.5, 2.5)}


def fit_power(n, loss, delta: float = HUBER_DELTA, grid: dict | None = None) -> Fit:
    """``L(N) = A N^-alpha + C`` (module doc) fitted to sizes ``n`` and losses ``loss``."""
    logn, logl = np.log(np.asarray(n, float)), np.log(np.asarray(loss, float))
    g = grid or POWER_GRID
    starts = [np.array(s, float) for s in itertools.product(g["a"], g["alpha"], g["c"])]
    best, objs = _best_of(_power_obj, starts, (logn, logl, delta), bounds=[(-20, 40), (0.0, 3.0), (-5, 5)])
    a, alpha, c = best.x
    coef = {"A": float(np.exp(a)), "alpha": float(alpha), "C": float(np.exp(c))}
    res = logl - np.log(power_law(np.exp(logn), **coef))
    return Fit("L(N) = A N^-alpha + C", coef, float(best.fun), len(starts), _converged(objs, best.fun),
               tuple(float(x) for x in res))


def _best_of(obj, starts, args, bounds):
    """L-BFGS-B from every start; the best result and every end objective."""
    # tolerances far below the defaults: in the Huber loss's linear part the gradient is at most
    # delta per point, and the default gtol (1e-5) stops a start before it has moved
    opts = {"gtol": 1e-12, "ftol": 1e-15, "maxiter": 5000}
    results = [minimize(obj, s, args=args, jac=True, method="L-BFGS-B", bounds=bounds, options=opts) for s in starts]
    objs = np.array([r.fun for r in results])
    return results[int(np.argmin(objs))], objs


def _converged(objs: np.ndarray, best: float) -> int:
    return int(np.sum(objs <= best + 1e-9))


# ---- Chinchilla's L(N, D) = E + A / N^alpha + B / D^beta ----

def chinchilla(n, d, E: float, A: float, B: float, alpha: float, beta: float) -> np.ndarray:
    return E + A / np.asarray(n, float) ** alpha + B / np.asarray(d, float) ** beta


def _chin_obj(theta, logn, logd, logl, delta):
    a, b, e, alpha, beta = theta
    pred, w = _lse_terms([a - alpha * logn, b - beta * logd, np.full_like(logn, e)])
    r = pred - logl
    g = huber_grad(r, delta)
    grad = np.array([np.sum(g * w[0]), np.sum(g * w[1]), np.sum(g * w[2]),
                     np.sum(g * w[0] * -logn), np.sum(g * w[1] * -logd)])
    return float(np.sum(huber(r, delta))), grad


# Hoffmann et al.'s grid (section D.2) is alpha, beta in {0, 0.5, ..., 2}, e in {-1, -.5, ..., 1},
# a, b in {0, 5, ..., 25}: 4,500 starts. This one is coarser (288 starts): the ladder's losses
# are a few points, each fit takes milliseconds, and the bootstrap refits hundreds of times.
CHIN_GRID = {"a": (0.0, 5.0, 10.0, 20.0), "b": (0.0, 5.0, 10.0, 20.0), "e": (-1.0, 0.5, 1.5),
             "alpha": (0.2, 0.5, 1.0), "beta": (0.2, 0.5)}


def fit_chinchilla(n, d, loss, delta: float = HUBER_DELTA, grid: dict | None = None) -> Fit:
    """Chinchilla's form (module doc) fitted to sizes ``n``, tokens ``d`` and losses ``loss``."""
    logn, logd = np.log(np.asarray(n, float)), np.log(np.asarray(d, float))
    logl = np.log(np.asarray(loss, float))
    g = grid or CHIN_GRID
    starts = [np.array(s, float) for s in itertools.product(g["a"], g["b"], g["e"], g["alpha"], g["beta"])]
    bounds = [(-20, 60), (-20, 60), (-5, 5), (0.0, 3.0), (0.0, 3.0)]
    best, objs = _best_of(_chin_obj, starts, (logn, logd, logl, delta), bounds)
    a, b, e, alpha, beta = best.x
    coef = {"E": float(np.exp(e)), "A": float(np.exp(a)), "B": float(np.exp(b)), "alpha": float(alpha),
            "beta": float(beta)}
    res = logl - np.log(chinchilla(np.exp(logn), np.exp(logd), **coef))
    return Fit("L(N, D) = E + A / N^alpha + B / D^beta", coef, float(best.fun), len(starts),
               _converged(objs, best.fun), tuple(float(x) for x in res))


# ---- the whole-curve law (Tissue et al. 2024) ----

def areas(lrs, momentum: float = MOMENTUM) -> tuple[np.ndarray, np.ndarray]:
    """(S1, S2) after each step of a schedule ``lrs`` (module doc): the forward area, the
    cumulative sum of the rates, and the annealing area, the cumulative sum of the
    momentum-smoothed decreases (a rising rate, warm-up, anneals nothing)."""
    eta = np.asarray(lrs, float)
    s1 = np.cumsum(eta)
    drop = np.maximum(0.0, np.concatenate([[0.0], eta[:-1] - eta[1:]]))
    m = np.empty_like(eta)
    acc = 0.0
    for i, x in enumerate(drop):
        acc = momentum * acc + x
        m[i] = acc
    return s1, np.cumsum(m)


def curve_law(n, s1, s2, E: float, A: float, alpha: float, B: float, beta: float, C: float) -> np.ndarray:
    """``L(N, s) = E + A / N^alpha + B S1^-beta - C S2`` (module doc)."""
    return E + A / np.asarray(n, float) ** alpha + B * np.asarray(s1, float) ** -beta - C * np.asarray(s2, float)


def _curve_obj(theta, logn, s1, s2, loss, delta):
    e, a, alpha, b, beta, c = theta
    ee, ea, eb, ec = np.exp(e), np.exp(a), np.exp(b), np.exp(c)
    tn, ts = ea * np.exp(-alpha * logn), eb * s1 ** -beta
    pred = ee + tn + ts - ec * s2
    if np.any(pred <= 0):
        return 1e6, np.zeros(6)
    r = np.log(pred) - np.log(loss)
    g = huber_grad(r, delta) / pred
    grad = np.array([np.sum(g * ee), np.sum(g * tn), np.sum(g * tn * -logn), np.sum(g * ts),
                     np.sum(g * ts * -np.log(s1)), np.sum(g * -ec * s2)])
    return float(np.sum(huber(r, delta))), grad


CURVE_GRID = {"e": (0.0, 1.0), "a": (1.0, 4.0), "alpha": (0.2, 0.6), "b": (0.0, 1.5), "beta": (0.3, 0.8),
              "c": (-2.0, 1.0)}


def fit_curves(n, s1, s2, loss, delta: float = HUBER_DELTA, grid: dict | None = None) -> Fit:
    """The whole-curve law fitted to points (size, S1, S2, loss) of every curve at once."""
    args = tuple(np.asarray(x, float) for x in (np.log(n), s1, s2, loss)) + (delta,)
    g = grid or CURVE_GRID
    starts = [np.array(s, float) for s in itertools.product(*(g[k] for k in ("e", "a", "alpha", "b", "beta", "c")))]
    bounds = [(-5, 3), (-20, 40), (0.0, 3.0), (-10, 10), (0.0, 3.0), (-20, 10)]
    best, objs = _best_of(_curve_obj, starts, args, bounds)
    e, a, alpha, b, beta, c = best.x
    coef = {"E": float(np.exp(e)), "A": float(np.exp(a)), "alpha": float(alpha), "B": float(np.exp(b)),
            "beta": float(beta), "C": float(np.exp(c))}
    res = np.log(np.asarray(loss, float)) - np.log(curve_law(n, s1, s2, **coef))
    return Fit("L(N, s) = E + A / N^alpha + B S1^-beta - C S2", coef, float(best.fun), len(starts),
               _converged(objs, best.fun), tuple(float(x) for x in res))


RATE_EXPONENTS = tuple(round(0.1 * i, 1) for i in range(11))  # gamma's grid, [0, 1]: the rate's
# weight from none (progress per step of the schedule's shape) to the paper's (progress per unit rate)


def at_rate(lrs, gamma: float = 1.0, ref: float | None = None) -> np.ndarray:
    """Schedule ``lrs`` as the curve law reads it (module doc): scaled by
    ``(peak / ref)^(gamma - 1)``; unchanged at ``gamma = 1`` or at the reference peak."""
    eta = np.asarray(lrs, float)
    if ref is None or gamma == 1.0:
        return eta
    return eta * (eta.max() / ref) ** (gamma - 1.0)


def profile_rate(fit_at, exponents=None) -> tuple[float, dict]:
    """(the gamma whose fit has the lowest objective, {gamma: objective}); ``fit_at(gamma)``
    fits the whole-curve law with every schedule read at that gamma, for each of
    ``exponents`` (default :data:`RATE_EXPONENTS`). Ties go to the larger gamma (the
    paper's form)."""
    objectives = {g: fit_at(g).objective for g in (RATE_EXPONENTS if exponents is None else exponents)}
    best = min(objectives, key=lambda g: (objectives[g], -g))
    return best, objectives


def steps_to(coef: dict, n: float, lrs, target: float, momentum: float = MOMENTUM) -> int | None:
    """The first step (1-based) at which the whole-curve law for size ``n`` under schedule
    ``lrs`` predicts a loss at or below ``target``; None if it never does within ``lrs``."""
    s1, s2 = areas(lrs, momentum)
    pred = curve_law(n, s1, s2, **coef)
    hit = np.flatnonzero(pred <= target)
    return int(hit[0]) + 1 if hit.size else None


# ---- intervals ----

def bootstrap(fitter, xs: tuple, loss, fit: Fit, draws: int = 200, seed: int = 0,
              q: tuple = (2.5, 97.5)) -> Fit:
    """``fit`` with percentile intervals of each coefficient from a residual bootstrap: the
    losses redrawn as fitted value x exp(resampled log residual), refitted by
    ``fitter(*xs, loss)`` (pass a fitter with a small grid around ``fit``:
    :func:`grid_near`; a draw is a small perturbation of the data)."""
    rng = np.random.default_rng(seed)
    res = np.asarray(fit.residuals, float)
    fitted = np.asarray(loss, float) * np.exp(-res)
    rows = []
    for _ in range(draws):
        again = fitter(*xs, fitted * np.exp(rng.choice(res, size=res.size, replace=True)))
        rows.append([again.coef[k] for k in fit.coef])
    arr = np.array(rows)
    lo, hi = np.percentile(arr, q, axis=0)
    interval = {k: (float(l), float(h)) for k, l, h in zip(fit.coef, lo, hi)}
    return Fit(fit.form, fit.coef, fit.objective, fit.starts, fit.converged, fit.residuals, interval)


_PARAMS = {"L(N) = A N^-alpha + C": (("a", "A"), ("alpha", None), ("c", "C")),
           "L(N, D) = E + A / N^alpha + B / D^beta": (("a", "A"), ("b", "B"), ("e", "E"), ("alpha", None),
                                                       ("beta", None)),
           "L(N, s) = E + A / N^alpha + B S1^-beta - C S2": (("e", "E"), ("a", "A"), ("alpha", None), ("b", "B"),
                                                              ("beta", None), ("c", "C"))}


def grid_near(fit: Fit) -> dict:
    """A grid of one start, ``fit``'s end point, in the fitter's parametrisation (logs of the
    positive coefficients, the exponents as they are): what a bootstrap draw starts from."""
    out = {}
    for key, name in _PARAMS[fit.form]:
        out[key] = (float(np.log(fit.coef[name])),) if name else (fit.coef[key],)
    return out
