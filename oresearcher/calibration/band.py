"""The band a calibrated prediction carries: how far a run on this host may land from it,
from what calibration itself measured (pure).

A prediction is the simulator run at the rates calibration measured. A real run later
meets the host at another moment: on a shared machine its level (how fast a step goes,
how long ranks wait at a collective) drifts, and each step scatters about that level.
Calibration sees both in its own repeats: it times ``compute_steps`` consecutive steps with
every rank busy, and each of the program's own collectives. Split into ``blocks`` runs of
consecutive steps (collectives), the series is read as a one-way random-effects model
(:func:`difference_cv`): a level drawn per block (the host's drift, variance ``L``) plus an
independent scatter per step (variance ``W``, pooled within the blocks). The block means
vary by ``L + W / b`` (``b`` steps a block), so ``L`` is that spread less ``W / b``, at
least 0. A run as long as the calibration and the calibration each meet the level once and
average their own ``n`` steps, so their difference has the variance ``2 (L + W / n)``;
the band is Student's 97.5% quantile of its standard deviations (a two-sided 95% band; the
degrees of freedom are Satterthwaite's: about 4 where five block means carry the spread,
25 where the steps' scatter does), relative to the mean, plus the
share of CPU time the hypervisor took from the machine while calibration ran (a host
busier than its load says; that time can be there during the run or not), plus how far the
host's contention moved while it ran (the share of a core a process gets, from the
1-minute load average before and after: :func:`contention_change`):

    half width = t(0.975, dof) x sqrt(2 (L + W / n)) / mean + stolen share + contention change

for the step time and for the communication overhead, with the compute steps' and the
collectives' spreads propagated to first order: a step is compute C plus the time ranks are
held at collectives E (h = E / (C + E) of it, from the same calibration), so the step
time's spread is ``hypot((1 - h) cv_C, h cv_E)`` and the overhead's ``(1 - h) hypot(cv_C,
cv_E)`` (:func:`half_widths`). Reading the spread of the block means as the level
alone would count each step's scatter at ``1 / b`` instead of ``1 / n``, ``blocks`` times
too much. The band is what this host's calibration supports; when it is wider than the
+-20% a prediction is useful at, the report says so instead of narrowing it.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..reporting.compare import band  # noqa: F401  (the band itself: the simulator reads it there)

USEFUL = 0.20  # wider than +-20%, a prediction no longer tells configurations apart
BLOCKS = 5


def _blocks(xs, blocks: int) -> list[list[float]]:
    """``blocks`` runs of consecutive values (the last takes the remainder)."""
    xs = list(xs)
    size = len(xs) // blocks
    return [xs[i * size:(i + 1) * size if i < blocks - 1 else len(xs)] for i in range(blocks)]


def difference_cv(xs, blocks: int = BLOCKS) -> tuple[float, float]:
    """(cv, dof): the relative standard deviation of the difference between the mean of
    ``xs`` and the mean of as many steps of the same process at another moment (module doc),
    ``sqrt(2 (L + W / n)) / mean`` with ``W`` the scatter pooled within ``blocks`` runs of
    consecutive values and ``L = max(0, var(block means) - W / b)`` the level's drift; and
    the degrees of freedom of that estimate (Satterthwaite's, the drift's part counted at the
    block means' ``k - 1``, the scatter's at ``n - k``: ``k - 1`` where the drift carries the
    spread, ``n - k`` where the scatter does). (0, inf) with fewer than 2 values a block."""
    xs = list(xs)
    if len(xs) < 2 * blocks or statistics.fmean(xs) <= 0:
        return 0.0, math.inf
    n, parts = len(xs), _blocks(xs, blocks)
    within = sum((len(p) - 1) * statistics.variance(p) for p in parts) / (n - blocks)
    level = max(0.0, statistics.variance([statistics.fmean(p) for p in parts]) - within * blocks / n)
    terms = ((2.0 * level, blocks - 1), (2.0 * within / n, n - blocks))
    var = terms[0][0] + terms[1][0]
    return math.sqrt(var) / statistics.fmean(xs), satterthwaite(var, terms)


def satterthwaite(var: float, terms) -> float:
    """Degrees of freedom of a variance ``var`` estimated as a sum of ``terms`` (c s^2, d):
    ``var^2 / sum((c s^2)^2 / d)`` (Satterthwaite 1946); inf for a zero or exact estimate."""
    den = sum(v * v / d for v, d in terms)
    return var * var / den if den > 0 and var > 0 else math.inf


def quantile(dof: float) -> float:
    """Student's t at 97.5% with ``dof`` degrees of freedom (1.96 at inf): the half width of
    a two-sided 95% band in standard deviations of an estimated spread."""
    from scipy.stats import t

    return float(t.ppf(0.975, max(dof, 1.0)))


def group_pace(step_seconds_per_rank) -> list[float]:
    """Each step's compute seconds, mean over ranks (steps aligned by index)."""
    steps = min((len(s) for s in step_seconds_per_rank), default=0)
    return [statistics.fmean(s[t] for s in step_seconds_per_rank) for t in range(steps)]


def exposed_series(arrival_waits, transfer_s: dict) -> list[float]:
    """Seconds a rank is held at each of the program's own collectives, in order: its kind's
    transfer (``transfer_s``: kind -> the in-run mean) plus how much earlier the rank came
    or later it woke (``wait_s``)."""
    return [transfer_s.get(r["kind"], 0.0) + r["wait_s"] for r in arrival_waits]


def exposed_share(pace, held) -> float:
    """The share of a step ranks spend held at the program's collectives: their total per
    step over compute plus it (``pace``: compute seconds per step; ``held``: seconds per
    collective over the same steps); 0 without either."""
    if not pace or not held:
        return 0.0
    e = sum(held) / len(pace)
    return e / (statistics.fmean(pace) + e)


def half_widths(step: tuple[float, float], exposed: tuple[float, float], stolen: float = 0.0,
                share: float = 0.0) -> dict:
    """{'step_time': w, 'comm_overhead': w}: the band's relative half widths (module doc),
    from the compute steps' and the collectives' :func:`difference_cv` (each a (cv, dof))
    and ``share`` = h, the exposed part of a step (:func:`exposed_share`). A step is compute
    C plus exposed E, so its relative spread is ``hypot((1 - h) cv_C, h cv_E)``; the overhead
    E / (C + E) moves by ``(1 - h) (dE / E - dC / C)``, so its spread is
    ``(1 - h) hypot(cv_C, cv_E)`` (first order, C and E independent). Each is multiplied by
    Student's quantile at its degrees of freedom (Satterthwaite)."""
    (c, dc), (e, de) = step, exposed
    h = min(max(share, 0.0), 1.0)
    a, b = (1 - h) * c, h * e
    step_var = a * a + b * b
    both = c * c + e * e
    return {"step_time": quantile(satterthwaite(step_var, ((a * a, dc), (b * b, de)))) * math.sqrt(step_var) + stolen,
            "comm_overhead": quantile(satterthwaite(both, ((c * c, dc), (e * e, de)))) * (1 - h) * math.sqrt(both)
            + stolen}


def cpu_ticks(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(stolen, all) CPU ticks since boot, summed over cores, from Linux's /proc/stat;
    None where there is none (stolen: time a virtual machine's hypervisor ran something
    else while this machine had work)."""
    try:
        fields = [int(x) for x in Path(path).read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields)) if len(fields) == 8 else None


def stolen(a, b) -> float | None:
    """Share of the CPU time between two :func:`cpu_ticks` readings that was stolen."""
    if a is None or b is None or b[1] <= a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1])


def core_share(load: float, cores: int) -> float:
    """The share of a core a runnable process gets at a 1-minute load average ``load`` on
    ``cores`` cores (every runnable process counted, this calibration's ranks too)."""
    return min(1.0, cores / load) if load > 0 else 1.0


def contention_change(load_before: float, load_after: float, cores: int) -> float:
    """How much a process's share of a core moved while calibration ran, relative to its
    mean: the host's contention changing under the measurement (0 on a steady host)."""
    a, b = core_share(load_before, cores), core_share(load_after, cores)
    return abs(b - a) / ((a + b) / 2)


