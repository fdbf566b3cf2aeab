"""The run figures: timeline, step breakdown, sweep, and the one-page summary.

Every ``draw_*`` function draws on an axes it is given (so the summary page reuses it);
every ``*_png`` function writes one PNG and returns the figure's axes' titles for the
caller's log. matplotlib with the Agg backend: no display needed. Time axes use SI
prefixes (``500 µs``, ``1.5 ms``) through :class:`matplotlib.ticker.EngFormatter`.

Timelines of up to ``MAX_LANES`` ranks draw one lane per rank (compute, communication in
flight, blocked); larger runs (a 1,024-rank cluster) draw a heat map of each rank's
dominant activity per time bin, which stays readable at any rank count.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .curves import SITime, draw_curves, curve_panels  # noqa: E402

COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "blocked": "#C44E52", "idle": "#E8E8E8"}
LABELS = {"compute": "compute", "comm": "comm in flight", "blocked": "blocked (exposed comm)", "idle": "idle"}
MAX_LANES = 16
DPI = 110


def si_time(seconds: float) -> str:
    """``1317.25e-3 -> '1,317 ms'``, ``4.8e-5 -> '48.0 µs'``: 3-4 significant digits, SI prefix."""
    s = abs(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            break
    else:
        unit, scale = "ns", 1e-9
    v = seconds / scale
    digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
    return f"{v:,.{digits}f} {unit}"


def time_axis(axis) -> None:
    """SI ticks in seconds on ``axis`` (ax.xaxis or ax.yaxis)."""
    axis.set_major_formatter(SITime())


def _save(fig, path: Path) -> None:
    from oresearcher.files import save_figure  # a new temp file renamed over path: never through a link

    save_figure(fig, Path(path), dpi=DPI)


def _legend(ax, cats, ncol=None) -> None:
    """Legend above the axes, outside the data and clear of the axis labels."""
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in cats]
    ax.legend(handles, [LABELS[c] for c in cats], fontsize=8, frameon=False, ncol=ncol or len(cats),
              loc="lower left", bbox_to_anchor=(0.0, 1.0), borderaxespad=0.2)


# ---- timeline ----------------------------------------------------------------------

def horizon(tl, max_steps: int) -> tuple[float, float, int]:
    """(start, end, steps shown): the first ``max_steps`` steps of rank 0."""
    t0 = tl.t0 or 0.0
    ends = tl.step_ends.get(0) or [max((s.end for s in tl.spans), default=t0 + 1.0)]
    shown = min(max_steps, len(ends))
    end = ends[shown - 1]
    return t0, end if end > t0 else t0 + 1e-9, shown


def first_roles(tl) -> dict[int, str]:
    """rank -> the role it had in its first recorded step (the steps a timeline shows);
    empty for programs without roles."""
    from .final import ROLES

    out = {}
    for rank, history in tl.metrics.items():
        v = next((m.get("role") for _, _, m in history if m.get("role") is not None), None)
        if isinstance(v, str) and v:
            out[rank] = v
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < len(ROLES):
            out[rank] = ROLES[int(v)]
    return out


def lane_label(rank: int, roles: dict[int, str]) -> str:
    return f"rank {rank} ({roles[rank]})" if rank in roles else f"rank {rank}"


def draw_lanes(ax, tl, ranks, t0: float, t1: float) -> None:
    """One lane per rank: compute (thick), comm in flight and blocked (thin, below)."""
    lanes = {"compute": (0.0, 0.4), "comm": (0.45, 0.2), "blocked": (0.7, 0.2)}
    row = {r: i for i, r in enumerate(ranks)}
    bars: dict = {}
    floor = (t1 - t0) * 2e-4  # a span too short to see still gets a sliver
    for s in tl.spans:
        if s.rank in row and s.start <= t1 and s.end >= t0 and s.cat in lanes:
            bars.setdefault((s.rank, s.cat), []).append((s.start - t0, max(s.end - s.start, floor)))
    for (rank, cat), xs in bars.items():  # one call per lane: thousands of spans stay fast
        y, h = lanes[cat]
        ax.broken_barh(xs, (row[rank] + y - 0.45, h), color=COLORS[cat])
    ax.set_ylim(len(ranks) - 0.5, -0.55)
    step = max(1, len(ranks) // 16)
    roles = first_roles(tl)  # explorer / optimizer / validator: who waits on whom reads off the lanes
    names = getattr(tl, "lane_names", {})  # a symmetric run's classes (sim/symmetry.py)
    ax.set_yticks(range(0, len(ranks), step),
                  [names.get(ranks[i]) or lane_label(ranks[i], roles) for i in range(0, len(ranks), step)])


def activity_grid(tl, ranks, t0: float, t1: float, bins: int) -> np.ndarray:
    """[len(ranks), bins] codes of each rank's dominant activity per time bin:
    0 idle, 1 compute, 2 comm in flight (not blocked, not computing), 3 blocked."""
    width = (t1 - t0) / bins
    row = {r: i for i, r in enumerate(ranks)}
    cover = np.zeros((3, len(ranks), bins))  # compute, comm, blocked seconds per bin
    idx = {"compute": 0, "comm": 1, "blocked": 2}
    for s in tl.spans:
        if s.rank not in row or s.cat not in idx or s.end <= t0 or s.start >= t1:
            continue
        a, b = (max(s.start, t0) - t0) / width, (min(s.end, t1) - t0) / width
        i0, i1 = int(a), min(int(b), bins - 1)
        plane = cover[idx[s.cat], row[s.rank]]
        if i0 == i1:
            plane[i0] += (b - a) * width
            continue
        plane[i0] += (i0 + 1 - a) * width
        plane[i0 + 1:i1] += width
        plane[i1] += (b - i1) * width
    compute, comm, blocked = cover
    idle = np.clip(width - compute - blocked, 0.0, None)
    code = np.argmax(np.stack([idle, compute, np.zeros_like(idle), blocked]), axis=0)
    code[(code == 0) & (comm > 0.5 * width)] = 2  # idle while a collective is in flight
    return code


def draw_heatmap(ax, tl, ranks, t0: float, t1: float, bins: int = 400) -> None:
    grid = activity_grid(tl, ranks, t0, t1, bins)
    cmap = ListedColormap([COLORS[c] for c in ("idle", "compute", "comm", "blocked")])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=3, interpolation="nearest",
              extent=(0.0, t1 - t0, len(ranks) - 0.5, -0.5))
    ax.yaxis.set_major_locator(MaxNLocator(8, integer=True, steps=[1, 2, 4, 8]))
    ax.set_ylabel("rank")


def lane_ranks(tl) -> list:
    """The ranks to draw: every rank, or in a symmetric run (sim/symmetry.py), which
    records one rank per class, the ranks that stand for their classes."""
    names = getattr(tl, "lane_names", None)
    if not names:
        return list(range(tl.world_size))
    return sorted({s.rank for s in tl.spans} | set(names))


def draw_timeline(ax, tl, max_steps: int = 3, max_lanes: int = MAX_LANES) -> str:
    """Timeline of the first ``max_steps`` steps on ``ax``; returns a title for it."""
    t0, t1, shown = horizon(tl, max_steps)
    ranks = lane_ranks(tl)
    if len(ranks) <= max_lanes:
        draw_lanes(ax, tl, ranks, t0, t1)
        _legend(ax, ("compute", "comm", "blocked"))
        kind = "per class" if getattr(tl, "lane_names", None) else "per rank"
    else:
        draw_heatmap(ax, tl, ranks, t0, t1)
        _legend(ax, ("compute", "comm", "blocked", "idle"))
        kind = f"{len(ranks):,} ranks, dominant activity per time bin"
    for t in (tl.step_ends.get(0) or [])[:shown]:
        ax.axvline(t - t0, color="black", lw=0.6, ls=":", alpha=0.6)
    ax.set_xlim(0, t1 - t0)
    time_axis(ax.xaxis)
    ax.set_xlabel("time since the first op (dotted: rank 0's step ends)")
    later = later_collectives(tl, t1)
    return (f"first {shown} step{'s' if shown != 1 else ''}, {kind}"
            + (f"; later, not shown: {', '.join(later[:3])}{' ...' if len(later) > 3 else ''}" if later else ""))


def later_collectives(tl, t1: float) -> list[str]:
    """Collectives the run made only after ``t1``: a round's second phase (a fusion every
    communication.interval steps, a distillation after training) that the first steps do
    not show, so the caption can say the timeline shows the first phase only."""
    early, late = set(), set()
    for s in tl.spans:
        if s.cat == "comm":
            (early if s.start <= t1 else late).add(s.name)
    return sorted(late - early)


def timeline_png(tl, path: Path, max_steps: int = 3, title: str = "") -> None:
    """Per-rank timeline (or heat map, past ``MAX_LANES`` ranks) of the first steps."""
    n = len(lane_ranks(tl))
    height = 1.6 + 0.42 * n if n <= MAX_LANES else 2.0 + min(n, 1024) / 160
    fig, ax = plt.subplots(figsize=(11, height), layout="constrained")
    what = draw_timeline(ax, tl, max_steps)
    fig.suptitle(f"{title + ': ' if title else ''}{what}", fontsize=11)
    _save(fig, path)


# ---- breakdown -----------------------------------------------------------------------

def step_rows(report: dict) -> list[tuple[str, float, str]]:
    """(label, seconds per step, colour) of the step and its parts; zero parts dropped."""
    step = report["step_time_s"]
    other = step - report["compute_time_s"] - report["exposed_comm_time_s"]
    rows = [("step time", step, "#555555"), ("compute", report["compute_time_s"], COLORS["compute"]),
            ("exposed comm", report["exposed_comm_time_s"], COLORS["blocked"]),
            ("other (idle, host)", other, "#AAAAAA"), ("comm in flight", report["comm_time_s"], COLORS["comm"])]
    return [(n, v, c) for n, v, c in rows if v > 1e-6 * max(step, 1e-30)]


def draw_step_bar(ax, report: dict) -> None:
    """One labelled bar per part of the step: step, compute, exposed comm, other, in flight."""
    rows = step_rows(report)
    bars = ax.barh([n for n, _, _ in rows], [v for _, v, _ in rows], color=[c for _, _, c in rows], height=0.65)
    ax.bar_label(bars, [si_time(v) for _, v, _ in rows], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(v for _, v, _ in rows) * 1.22)
    time_axis(ax.xaxis)
    ax.set_xlabel("per step (mean over ranks)")
    ax.set_title(f"comm overhead {report['comm_overhead']:.1%} (exposed / step)", fontsize=10)


def collective_rows(report: dict) -> list[tuple[str, float]]:
    """(name, in-flight seconds per step per rank) of every collective that took time."""
    return [(n, t) for n, t, _ in collective_parts(report)]


def collective_parts(report: dict) -> list[tuple[str, float, float]]:
    """(name, in-flight seconds, of which waiting for slower peers) per step per rank, of
    every collective that took time. Only the simulator knows when every member arrived
    (``peer_wait_s``); a real run's rows have no waiting part."""
    steps, ws = max(report.get("steps", 1), 1), max(report.get("world_size", 1), 1)
    rows = [(r["name"], r["time_s"] / steps / ws, min(r.get("peer_wait_s", 0.0), r["time_s"]) / steps / ws)
            for r in report.get("breakdown", [])]
    return [(n, t, w) for n, t, w in rows if t > 0]


def draw_collectives(ax, report: dict) -> None:
    """One bar per collective: waiting for slower peers (hatched) then the transfer itself."""
    rows = collective_parts(report)
    if not rows:
        ax.text(0.5, 0.5, "no collectives", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    names, waits = [n for n, _, _ in rows], [w for _, _, w in rows]
    if any(waits):
        ax.barh(names, waits, color="white", edgecolor=COLORS["comm"], hatch="///", height=0.65,
                label="waiting for peers")
    bars = ax.barh(names, [t - w for _, t, w in rows], left=waits, color=COLORS["comm"], height=0.65,
                   label="transfer")
    ax.bar_label(bars, [si_time(t) + (f" ({si_time(w)} waiting)" if w > 0.005 * t else "") for _, t, w in rows],
                 padding=3, fontsize=8)
    if any(waits):
        ax.legend(fontsize=7, frameon=False, loc="lower right")
    ax.set_xlim(0, max(t for _, t, _ in rows) * (1.9 if any(waits) else 1.25))
    ax.set_ylim(max(len(rows), 2) - 0.5, -0.5)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    time_axis(ax.xaxis)
    ax.set_xlabel("in flight per step per rank")
    ax.set_title("per collective", fontsize=10)


def breakdown_png(report: dict, path: Path, title: str = "") -> None:
    """Step time split into compute and exposed communication, plus per-collective time."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.4), layout="constrained", width_ratios=(3, 2))
    draw_step_bar(a, report)
    draw_collectives(b, report)
    if title:
        fig.suptitle(title, fontsize=11)
    _save(fig, path)


# ---- sweep ---------------------------------------------------------------------------

def sweep_png(field: str, values: list, reports: list[dict], path: Path, title: str = "") -> None:
    """What a sweep is about: communication in flight and exposed (own axis), and overhead."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    xs = [str(v) for v in values]
    a.plot(xs, [r["comm_time_s"] for r in reports], "o-", color=COLORS["comm"], label="comm in flight")
    a.plot(xs, [r["exposed_comm_time_s"] for r in reports], "^-", color=COLORS["blocked"], label="exposed comm")
    a.set_ylim(bottom=0)
    time_axis(a.yaxis)
    a.set_ylabel("per step (mean over ranks)")
    a.set_title("communication per step", fontsize=10)
    a.legend(fontsize=8)
    b.plot(xs, [r["comm_overhead"] * 100 for r in reports], "o-", color=COLORS["blocked"])
    b.set_ylim(bottom=0)
    b.set_ylabel("comm overhead (% of step)")
    steps = [r["step_time_s"] for r in reports]
    lo, hi = si_time(min(steps)), si_time(max(steps))
    b.set_title(f"overhead (step time {lo}{f' to {hi}' if hi != lo else ''})", fontsize=10)
    for ax in (a, b):
        ax.set_xlabel(field)
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"sweep of {field}", fontsize=11)
    _save(fig, path)


# ---- summary page ----------------------------------------------------------------------

def summary_png(report: dict, tl, path: Path, title: str = "") -> None:
    """One page for a report: step breakdown, per collective, timeline excerpt, metric curve."""
    panels = curve_panels(report)
    fig = plt.figure(figsize=(11, 8.5 if panels else 6.2), layout="constrained")
    rows = (1.0, 1.5, 1.6) if panels else (1.0, 1.6)
    grid = fig.add_gridspec(len(rows), 2, height_ratios=rows, width_ratios=(3, 2))
    draw_step_bar(fig.add_subplot(grid[0, 0]), report)
    draw_collectives(fig.add_subplot(grid[0, 1]), report)
    ax = fig.add_subplot(grid[1, :])
    ax.set_title(draw_timeline(ax, tl, max_steps=3, max_lanes=8), fontsize=10, loc="right")
    if panels:
        axes = [fig.add_subplot(grid[2, i]) for i in range(2)] if len(panels) > 1 else [fig.add_subplot(grid[2, :])]
        draw_curves(axes, report, panels[:2])
    fig.suptitle(title or _default_title(report), fontsize=12)
    _save(fig, path)


def _default_title(report: dict) -> str:
    sc = report.get("scenario") or {}
    strategy = (sc.get("training") or {}).get("strategy", "?")
    return (f"{sc.get('name', 'run')}: {strategy}, {report.get('world_size', '?')} ranks, "
            f"{report.get('backend', '?')}, {report.get('steps', '?')} steps")


def write_run_figures(report: dict, tl, out: Path, what: str) -> list[str]:
    """Every figure of one run into ``out``: summary, timeline, breakdown (and curves when
    the run recorded metrics); returns the file names written. ``what`` names the run in
    titles, e.g. ``"local-gloo (2 ranks, gloo)"``."""
    from .curves import curve_png

    out = Path(out)
    summary_png(report, tl, out / "summary.png")
    timeline_png(tl, out / "timeline.png", title=what)
    breakdown_png(report, out / "breakdown.png", title=f"{what}: time per step")
    names = ["summary.png", "timeline.png", "breakdown.png"]
    if curve_png(report, out / "curve.png"):
        names.append("curve.png")
    return names
