"""Statistics over seeds for the experiments' verdicts: the mean with its 95% interval
(t-distribution), the paired difference of two methods over the seeds both ran, and
which side of 0 that interval lies on."""
from __future__ import annotations

import statistics


def mean_or_nan(xs) -> float:
    xs = list(xs)
    return statistics.mean(xs) if xs else float("nan")


def ci95(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the t-distribution's 95% interval of the mean."""
    from scipy import stats

    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    h = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, m - h, m + h


def paired(a: list[dict], b: list[dict], key: str) -> tuple[float, float, float] | None:
    """95% CI of the mean of a - b over the seeds both ran (runs without an ``error``);
    None below two pairs."""
    d = [x[key] - y[key] for x, y in zip(a, b) if "error" not in x and "error" not in y]
    return ci95(d) if len(d) >= 2 else None


def verdict_word(d: tuple[float, float, float] | None, above: str, below: str, holds_zero: str) -> str:
    """Which side of 0 the interval ``d`` = (mean, low, high) lies on: ``above``,
    ``below``, or ``holds_zero`` when it includes 0; "n/a" without an interval."""
    if d is None:
        return "n/a"
    return above if d[1] > 0 else below if d[2] < 0 else holds_zero
