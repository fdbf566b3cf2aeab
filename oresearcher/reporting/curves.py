"""Learning curves of a report: the task's loss and metric against (simulated) time.

A report's ``metrics`` hold, per rank, what its program passed to StepDone. What is
worth plotting depends on the task, so the panels are chosen from what is there:

- the task loss per step (``task_loss``: the plain objective, e.g. cross-entropy, even
  when the agents train on a reward-shaped loss; ``loss`` where the two are the same),
  or for reinforcement learning the training episode return (``train_return``), which a
  reader can judge, rather than the TD loss, which is noisy by construction;
- the task metric at evaluation points (``test_accuracy``, ``test_return``, ``metric``).

One line per agent, labelled with the roles it held. Where an agent recorded nothing for
a while (its steps moved to another agent, or it validated), the line breaks instead of
drawing a straight segment across the gap.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import EngFormatter, MaxNLocator  # noqa: E402


class SITime(EngFormatter):
    """Seconds with an SI prefix (``500 µs``, ``1.5 ms``); zero is a plain ``0``, not
    ``0 s`` beside ticks in ms."""

    def __init__(self):
        super().__init__(unit="s", places=None, sep=" ")

    def __call__(self, x, pos=None):
        return "0" if x == 0 else super().__call__(x, pos)

ROLE_NAMES = ("explorer", "optimizer", "validator")  # the ids backends/run/telemetry.py logs

# (panel title, candidate keys, first present wins; markers: sparse evaluation points)
STEP_PANELS = (
    ("episode return (training, mean of last 10)", ("train_return",)),
    ("task loss (training batch)", ("task_loss", "loss")),
)
EVAL_PANELS = (
    ("test accuracy", ("test_accuracy",)),
    ("test episode return (greedy)", ("test_return",)),
    ("task metric", ("metric",)),
)
GAP_FACTOR = 5.0  # a break in a line: more than this many typical steps without a point


def _has(report: dict, key: str) -> bool:
    return any(isinstance(m.get(key), (int, float)) for ms in report.get("metrics", {}).values() for m in ms)


def curve_panels(report: dict) -> list[tuple[str, str, bool]]:
    """[(title, metric key, sparse)] to plot for ``report``: a step-level panel, then an
    evaluation panel, each only where the report has the data."""
    out = []
    for group, sparse in ((STEP_PANELS, False), (EVAL_PANELS, True)):
        for title, keys in group:
            key = next((k for k in keys if _has(report, k)), None)
            if key is not None:
                out.append((title, key, sparse))
                break
    return out


def series(report: dict, key: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """rank -> (times, values) of ``key``, non-finite values dropped."""
    out = {}
    for r, ms in report.get("metrics", {}).items():
        pts = [(m["time_s"], float(m[key])) for m in ms
               if isinstance(m.get(key), (int, float)) and np.isfinite(m[key])]
        if pts:
            t, v = np.array(pts).T
            out[int(r)] = (t, v)
    return out


def break_gaps(t: np.ndarray, v: np.ndarray, factor: float = GAP_FACTOR) -> tuple[np.ndarray, np.ndarray]:
    """Insert NaN where consecutive points are more than ``factor`` median spacings apart,
    so matplotlib breaks the line there."""
    if len(t) < 3:
        return t, v
    dt = np.diff(t)
    typical = np.median(dt[dt > 0]) if (dt > 0).any() else 0.0
    cut = np.nonzero(dt > factor * typical)[0] + 1 if typical > 0 else np.array([], dtype=int)
    return np.insert(t, cut, np.nan), np.insert(v, cut, np.nan)


def isolated(v: np.ndarray) -> np.ndarray:
    """Mask of finite points with no finite neighbour (NaN or the end on both sides)."""
    ok = np.isfinite(v)
    left = np.concatenate([[False], ok[:-1]])
    right = np.concatenate([ok[1:], [False]])
    return ok & ~left & ~right


def roles_of(report: dict, rank: int) -> list[str]:
    """The roles a rank held, in order, consecutive repeats merged."""
    out = []
    for m in report.get("metrics", {}).get(str(rank), []):
        role = m.get("role")
        if isinstance(role, (int, float)) and 0 <= int(role) < len(ROLE_NAMES):
            role = ROLE_NAMES[int(role)]
        if isinstance(role, str) and (not out or out[-1] != role):
            out.append(role)
    return out


def agent_label(report: dict, rank: int) -> str:
    roles = roles_of(report, rank)
    if not roles:
        return f"agent {rank}"
    shown = "→".join(roles[:3]) + ("→…" if len(roles) > 3 else "")
    return f"agent {rank} ({shown})"


def draw_curves(axes, report: dict, panels) -> None:
    """One panel per ``(title, key, sparse)`` on ``axes``; one line per agent."""
    clock = "simulated" if report.get("backend") == "sim" else "measured"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, key, sparse) in zip(axes, panels):
        data = series(report, key)
        if sparse and data and max(len(t) for t, _ in data.values()) <= 2:
            draw_final(ax, report, title, data, colors)
            continue
        for r, (t, v) in sorted(data.items()):
            if not sparse:
                t, v = break_gaps(t, v)
            marker = "o" if sparse or len(t) <= 60 else ""  # short runs: show every point
            line, = ax.plot(t, v, marker + "-", ms=3, lw=1.2 if sparse else 0.9,
                            color=colors[r % len(colors)], label=agent_label(report, r))
            alone = isolated(v)
            if alone.any() and not marker:  # a point between two gaps draws no line
                ax.plot(t[alone], v[alone], "o", ms=2, color=line.get_color())
        ax.set_title(title, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(6))
        ax.xaxis.set_major_formatter(SITime())
        ax.set_xlabel(f"{clock} time")
        ax.grid(alpha=0.3)
        if 0 < len(data) <= 8:
            ax.legend(fontsize=7)


def draw_final(ax, report: dict, title: str, data: dict, colors) -> None:
    """Bars of each agent's last value: a metric evaluated only at the end is no curve."""
    ranks = sorted(data)
    values = [data[r][1][-1] for r in ranks]
    names = [f"agent {r}\n{(roles_of(report, r) or ['-'])[-1]}" for r in ranks]
    bars = ax.bar(names, values, color=[colors[r % len(colors)] for r in ranks])
    ax.bar_label(bars, [f"{v:.3g}" for v in values], padding=2, fontsize=8)
    top = max(values)
    final = report.get("final") or {}
    deploy = final.get("deployable") if final.get("label") == title else None
    if deploy and deploy.get("rank") in ranks:  # one of the agents: outline its bar
        bar = bars[ranks.index(deploy["rank"])]
        bar.set_edgecolor("black")
        bar.set_linewidth(2)
        title = f"{title} (outlined: deployable)"
    elif deploy and deploy.get("value") is not None:  # a student or the shared model: a line
        ax.axhline(deploy["value"], color="black", ls="--", lw=1, label=f"deployable: {deploy['value']:.3g}")
        ax.legend(fontsize=7, loc="lower right")
        top = max(top, deploy["value"])
    ax.set_ylim(0, max(top, 1e-12) * 1.15)
    ax.set_title(f"final {title}", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    if len(ranks) > 8:
        ax.tick_params(axis="x", labelbottom=False)


def curve_png(report: dict, path: Path, title: str = "") -> bool:
    """Write the learning curves of ``report``; False (nothing written) without metrics."""
    panels = curve_panels(report)
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.6), layout="constrained",
                             squeeze=False)
    draw_curves(axes[0], report, panels)
    sc = report.get("scenario") or {}
    task = (sc.get("workload") or {}).get("task", "")
    fig.suptitle(title or f"{sc.get('name', 'run')}: learning curves{f' ({task})' if task else ''}", fontsize=11)
    from oresearcher.files import save_figure  # a new temp file renamed over path: never through a link

    save_figure(fig, Path(path), dpi=110)
    return True
