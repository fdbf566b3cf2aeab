"""Figures people would rather look at than read: timelines, breakdowns, sweeps.

matplotlib with the Agg backend (no display needed); every function writes one PNG.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "blocked": "#C44E52"}


def timeline_png(tl, path: Path, max_ranks: int = 16, max_steps: int = 3) -> None:
    """Per-rank timeline of the first ``max_steps`` steps: compute, comm in flight, blocked."""
    ranks = list(range(min(tl.world_size, max_ranks)))
    ends = tl.step_ends.get(0) or [max((s.end for s in tl.spans), default=1.0)]
    horizon = ends[min(max_steps, len(ends)) - 1]
    fig, ax = plt.subplots(figsize=(11, 0.5 + 0.45 * len(ranks)))
    lanes = {"compute": (0.0, 0.28), "comm": (0.3, 0.14), "blocked": (0.44, 0.14)}
    bars = {}
    for s in tl.spans:
        if s.rank in ranks and s.start <= horizon and s.cat in lanes:
            bars.setdefault((s.rank, s.cat), []).append((s.start, max(s.end - s.start, horizon * 1e-4)))
    for (rank, cat), xs in bars.items():  # one call per lane: thousands of spans stay fast
        y, h = lanes.get(cat, (0.0, 0.28))
        ax.broken_barh(xs, (rank + y, h), color=_COLORS.get(cat, "grey"))
    ax.set_xlim(0, horizon)
    ax.set_yticks([r + 0.3 for r in ranks], [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(f"first {min(max_steps, len(ends))} steps: compute, communication in flight, blocked on communication")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()]
    ax.legend(handles, ["compute", "comm in flight", "blocked (exposed comm)"], fontsize=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / len(ranks)), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def breakdown_png(report: dict, path: Path) -> None:
    """Step time split into compute and exposed communication, plus per-collective time."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    step = report["step_time_s"]
    parts = {"compute": report["compute_time_s"], "exposed comm": report["exposed_comm_time_s"]}
    parts["other/idle"] = max(step - sum(parts.values()), 0.0)
    left = 0.0
    for (k, v), c in zip(parts.items(), ("#4C72B0", "#C44E52", "#BBBBBB")):
        a.barh(0, v * 1e3, left=left, color=c, label=f"{k}: {v * 1e3:.3g} ms")
        left += v * 1e3
    a.barh(1, report["comm_time_s"] * 1e3, color="#DD8452", label=f"comm in flight: {report['comm_time_s'] * 1e3:.3g} ms")
    a.set_yticks([0, 1], ["step", "comm"])
    a.set_xlabel("ms per step")
    a.set_title(f"comm overhead {report['comm_overhead']:.1%}")
    a.legend(fontsize=8, loc="lower right")
    rows = report.get("breakdown", [])
    steps = max(report.get("steps", 1), 1)
    ws = max(report.get("world_size", 1), 1)
    b.bar([r["name"] for r in rows], [r["time_s"] / steps / ws * 1e3 for r in rows], color="#DD8452")
    b.set_ylabel("ms per step per rank (in flight)")
    b.set_title("per collective")
    b.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep_png(field: str, values: list, reports: list[dict], path: Path) -> None:
    """Step time, exposed communication and overhead against the swept value."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [str(v) for v in values]
    a.plot(xs, [r["step_time_s"] * 1e3 for r in reports], "o-", label="step time")
    a.plot(xs, [r["compute_time_s"] * 1e3 for r in reports], "s--", label="compute")
    a.plot(xs, [r["exposed_comm_time_s"] * 1e3 for r in reports], "^-", label="exposed comm")
    a.set_xlabel(field)
    a.set_ylabel("ms per step")
    a.legend(fontsize=8)
    b.plot(xs, [r["comm_overhead"] * 100 for r in reports], "o-", color="#C44E52")
    b.set_xlabel(field)
    b.set_ylabel("comm overhead (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


def curve_png(report: dict, path: Path, metric: str = "loss") -> bool:
    """Training metric against (simulated or measured) time, one line per rank."""
    series = {r: [(m["time_s"], m[metric]) for m in ms if metric in m] for r, ms in report.get("metrics", {}).items()}
    series = {r: s for r, s in series.items() if s}
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for r, s in sorted(series.items(), key=lambda kv: int(kv[0])):
        ax.plot([t for t, _ in s], [v for _, v in s], label=f"rank {r}", lw=1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(metric)
    if len(series) <= 8:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
