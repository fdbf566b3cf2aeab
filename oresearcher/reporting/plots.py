"""Figures people would rather look at than read: the names the entry points use.

The run figures live in :mod:`.figures` (timeline, breakdown, sweep, summary) and
:mod:`.curves` (learning curves); the collective bench draws its own (:mod:`oresearcher.sim.bench`).
matplotlib with the Agg backend (no display needed); every function writes one PNG.
"""
from __future__ import annotations

from .curves import curve_png  # noqa: F401
from .figures import breakdown_png, summary_png, sweep_png, timeline_png  # noqa: F401
