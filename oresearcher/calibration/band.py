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
the band is two of its standard deviations (about 95%), relative to the mean, plus the
share of CPU time the hypervisor took from the machine while calibration ran (a host
busier than its load says; that time can be there during the run or not), plus how far the
host's contention moved while it ran (the share of a core a process gets, from the
1-minute load average before and after: :func:`contention_change`):

    half width = 2 x sqrt(2 (L + W / n)) / mean + stolen share + contention change

for the step time (the steps) and for the communication overhead (exposed over step: the
steps' and the collectives' relative spreads combined, the exposed part from the
collectives' waits and transfers). Reading the spread of the block means as the level
alone would count each step's scatter at ``1 / b`` instead of ``1 / n``, ``blocks`` times
too much. The band is what this host's calibration supports; when it is wider than the
+-20% a prediction is useful at, the report says so instead of narrowing it.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..reporting.compare import band  # noqa: F401  (the band itself: the simulator reads it there)

Z = 2.0  # half widths in standard deviations of the difference (about 95%)
USEFUL = 0.20  # wider than +-20%, a prediction no longer tells configurations apart
BLOCKS = 5


def _blocks(xs, blocks: int) -> list[list[float]]:
    """``blocks`` runs of consecutive values (the last takes the remainder)."""
    xs = list(xs)
    size = len(xs) // blocks
    return [xs[i * size:(i + 1) * size if i < blocks - 1 else len(xs)] for i in range(blocks)]


def difference_cv(xs, blocks: int = BLOCKS) -> float:
    """The relative standard deviation of the difference between the mean of ``xs`` and the
    mean of as many steps of the same process at another moment (module doc):
    ``sqrt(2 (L + W / n)) / mean``, ``W`` the scatter pooled within ``blocks`` runs of
    consecutive values, ``L = max(0, var(block means) - W / b)`` the level's drift. 0 with
    fewer than 2 values a block."""
    xs = list(xs)
    if len(xs) < 2 * blocks or statistics.fmean(xs) <= 0:
        return 0.0
    parts = _blocks(xs, blocks)
    within = sum((len(p) - 1) * statistics.variance(p) for p in parts) / (len(xs) - blocks)
    level = max(0.0, statistics.variance([statistics.fmean(p) for p in parts]) - within * blocks / len(xs))
    return math.sqrt(2.0 * (level + within / len(xs))) / statistics.fmean(xs)


def group_pace(step_seconds_per_rank) -> list[float]:
    """Each step's compute seconds, mean over ranks (steps aligned by index)."""
    steps = min((len(s) for s in step_seconds_per_rank), default=0)
    return [statistics.fmean(s[t] for s in step_seconds_per_rank) for t in range(steps)]


def exposed_series(arrival_waits, transfer_s: dict) -> list[float]:
    """Seconds a rank is held at each of the program's own collectives, in order: its kind's
    transfer (``transfer_s``: kind -> the in-run mean) plus how much earlier the rank came
    or later it woke (``wait_s``)."""
    return [transfer_s.get(r["kind"], 0.0) + r["wait_s"] for r in arrival_waits]


def half_widths(step_cv: float, exposed_cv: float, stolen: float = 0.0) -> dict:
    """{'step_time': w, 'comm_overhead': w}: the band's relative half widths (module doc),
    from the steps' and the collectives' :func:`difference_cv`."""
    return {"step_time": Z * step_cv + stolen,
            "comm_overhead": Z * math.hypot(step_cv, exposed_cv) + stolen}


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


