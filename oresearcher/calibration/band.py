"""The band a calibrated prediction carries: how far a run on this host may land from it,
from what calibration itself measured (pure).

A prediction is the simulator run at the rates calibration measured. A real run later
meets the host at another moment: on a shared machine its level (how fast a step goes,
how long ranks wait at a collective) drifts by more than any model error. Calibration
sees that drift in its own repeats: it times ``compute_steps`` consecutive steps with
every rank busy, and each of the program's own collectives. Split into ``blocks`` runs
of consecutive steps (collectives), the block means spread as the host's level moved
while it ran (:func:`level_cv`). The run and the calibration each sample that level once,
independently, so their difference has sqrt(2) times that spread; the band is two of
those (about 95% of a normal spread), plus the share of CPU time the hypervisor took
from the machine while calibration ran (a host busier than its load says; that time can
be there during the run or not), plus how far the host's contention moved while it ran
(the share of a core a process gets, from the 1-minute load average before and after:
:func:`contention_change`):

    half width = 2 x sqrt(2) x cv + stolen share + contention change

for the step time (the steps' cv) and for the communication overhead (exposed over
step: the two cvs combined, the exposed part from the collectives' waits and transfers).
The band is what this host's calibration supports; when it is wider than the +-20% a
prediction is useful at, the report says so instead of narrowing it.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..reporting.compare import band  # noqa: F401  (the band itself: the simulator reads it there)

Z = 2.0  # half widths in standard deviations of the difference (about 95%)
USEFUL = 0.20  # wider than +-20%, a prediction no longer tells configurations apart
BLOCKS = 5


def block_means(xs, blocks: int = BLOCKS) -> list[float]:
    """Means of ``blocks`` runs of consecutive values (the last run takes the remainder);
    fewer than 2 values a block: one block."""
    xs = list(xs)
    size = len(xs) // blocks
    if size < 2:
        return [statistics.fmean(xs)] if xs else []
    return [statistics.fmean(xs[i * size:(i + 1) * size if i < blocks - 1 else len(xs)]) for i in range(blocks)]


def level_cv(xs, blocks: int = BLOCKS) -> float:
    """Spread of the level of a series over its consecutive blocks: std / mean of the block
    means (0 with fewer than two blocks)."""
    means = block_means(xs, blocks)
    if len(means) < 2 or statistics.fmean(means) <= 0:
        return 0.0
    return statistics.stdev(means) / statistics.fmean(means)


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
    """{'step_time': w, 'comm_overhead': w}: the band's relative half widths (module doc)."""
    k = Z * math.sqrt(2.0)
    return {"step_time": k * step_cv + stolen,
            "comm_overhead": k * math.hypot(step_cv, exposed_cv) + stolen}


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


