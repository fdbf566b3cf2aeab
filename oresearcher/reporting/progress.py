"""Progress of long work: a rich bar on a terminal, a plain line every few seconds otherwise.

A bar redrawn in place is useless in a log file or a pipe (``... | tee run.log``, CI),
and printing nothing leaves a user wondering whether a 10-minute simulation hangs. So
off a terminal :class:`ProgressLines` writes one line every ``every_s`` seconds::

    simulating steps: 120/200 (60%), 35.2 steps/s, ETA 2.3 s

Rates and ETA count only the steps done since this process started (a resumed run's
earlier steps took no time here), and once a second step is done, only the steps after
the first: the first carries the warm-up (building models, first allocations, lazy
initialisation), which would stretch every later ETA by its whole length.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO


def fmt_duration(seconds: float) -> str:
    """``42.0 -> '42 s'``, ``754 -> '12 min 34 s'``, ``7300 -> '2 h 1 min'``."""
    s = max(seconds, 0.0)
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    m, s = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {s} s"
    h, m = divmod(m, 60)
    return f"{h} h {m} min"


def progress_line(label: str, done: int, total: int, start: int, elapsed_s: float) -> str:
    """One progress line: done/total, percent, rate since ``start``, ETA."""
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    rate = (done - start) / elapsed_s if elapsed_s > 0 else 0.0
    eta = f", ETA {fmt_duration((total - done) / rate)}" if rate > 0 and total else ""
    return f"{label}: {done:,}/{total:,}{pct}, {rate:,.3g} steps/s{eta}"


class ProgressLines:
    """``update(done)`` writes a :func:`progress_line` when ``every_s`` seconds have passed."""

    def __init__(self, total: int, label: str, start: int = 0, every_s: float = 5.0,
                 stream: Optional[TextIO] = None, clock: Callable[[], float] = time.monotonic):
        self.total, self.label, self.start, self.every_s = total, label, start, every_s
        self.stream, self.clock = stream, clock
        self.t0 = self.last = clock()
        self.done = start
        self.first: Optional[tuple[int, float]] = None  # (steps done, time) at the first update past start

    def update(self, done: int, extra: str = "") -> None:
        self.done = done
        now = self.clock()
        if self.first is None and done > self.start:
            self.first = (done, now)
        if now - self.last >= self.every_s:
            self.last = now
            since, t0 = self.first if self.first and done > self.first[0] else (self.start, self.t0)
            self._write(progress_line(self.label, done, self.total, since, now - t0) + extra)

    def close(self) -> None:
        pass  # the caller prints what the work produced; a last line would repeat it

    def _write(self, line: str) -> None:
        stream = self.stream or sys.stderr
        print(line, file=stream, flush=True)
