"""Figures people would rather look at than read: timelines, breakdowns, sweeps.

matplotlib with the Agg backend (no display needed); every function writes one PNG.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "blocked": "#C44E52"}


# The run figures live in figures.py and curves.py; these names stay for the entry points.
from .curves import curve_png  # noqa: E402,F401
from .figures import breakdown_png, summary_png, sweep_png, timeline_png  # noqa: E402,F401


def collective_bench_png(op: str, rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.semilogx([r["size_bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"simulated {op}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
