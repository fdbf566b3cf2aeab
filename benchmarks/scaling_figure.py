"""The figure of bench_scaling --check --figure PATH: each strategy's validation loss against
non-embedding parameters with its fitted size law, the held-out size marked; each
strategy's loss ratio to data parallel against N; the held-out size's training curve
beside the whole-curve law fitted on the other sizes, the target dotted."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from oresearcher.files import save_figure
from oresearcher.models import scaling_laws as S


def draw(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(16, 4.4))
    for k, (strategy, pts) in enumerate(out["points"].items()):
        color = f"C{k}"
        n = np.array([p["n"] for p in pts], float)
        ax.plot(n, [p["val_loss"] for p in pts], "o", color=color, label=strategy)
        fit = out["size_law"].get(strategy)
        if fit:
            grid = np.geomspace(n.min() / 1.5, n.max() * 4, 80)
            ax.plot(grid, S.power_law(grid, **fit["coef"]), "-", color=color, lw=1)
        h = out["held_out"].get(strategy)
        if h:
            ax.plot([h["n"]], [h["predicted_loss"]], "x", color=color, ms=9)
            c = h["curve"]
            keep = [i for i, s in enumerate(c["step"]) if s >= 0.1 * c["step"][-1]]  # the law's fitted range:
            step = [c["step"][i] for i in keep]  # after warm-up (scaling_report.curve_points)
            cx.plot(step, [c["measured"][i] for i in keep], "-", color=color, lw=1.2, label=f"{strategy} measured")
            cx.plot(step, [c["predicted"][i] for i in keep], "--", color=color, lw=1, label=f"{strategy} predicted")
            cx.axhline(h["target"], color=color, lw=0.5, ls=":")
        rows = out["multipliers"].get(strategy, [])
        key = "m" if rows and all("m" in r for r in rows) else "loss_ratio"
        if strategy != "ddp" and rows:
            bx.plot([r["n"] for r in rows], [r[key] for r in rows], "o-", color=color, label=strategy)
    ax.set(xscale="log", xlabel="non-embedding parameters N", ylabel="validation loss (nats/token)",
           title="size laws L(N) = A N^-alpha + C (x: held-out prediction)")
    ax.legend(fontsize=8)
    bx.axhline(1.0, color="black", lw=0.8)
    bx.set(xscale="log", xlabel="non-embedding parameters N",
           ylabel="effective-token multiplier m (else loss / data parallel's)",
           title="each strategy against data parallel, by size")
    if bx.get_legend_handles_labels()[0]:
        bx.legend(fontsize=8)
    cx.set(xscale="log", xlabel="step", ylabel="training loss (nats/token), smoothed",
           title="held-out size after warm-up vs the whole-curve law")
    if cx.get_legend_handles_labels()[0]:
        cx.legend(fontsize=6, ncol=2, loc="lower left")
    fig.tight_layout()
    save_figure(fig, Path(path), dpi=110)
    plt.close(fig)


def draw_trend(out: dict, path: Path, to_model: str = "gpt-1.3b") -> None:
    """Each strategy's multiplier m against N, the straight line in (ln N, ln m) the
    simulator reads, and its 95% prediction band carried to ``to_model``'s non-embedding N
    (oresearcher.models.ladder_law)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from oresearcher.models import ladder_law as LL
    from oresearcher.models import n_non_embedding

    far = n_non_embedding(to_model)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for k, (row, trend) in enumerate(LL.trends(out).items()):
        pts = [(p["n"], p["m"]) for p in out["multipliers"][row] if p.get("m")]
        grid = np.geomspace(min(n for n, _ in pts) / 1.5, far * 1.5, 100)
        mid, low, high = np.array([trend.predict(n) for n in grid]).T
        ax.plot(*zip(*pts), "o", color=f"C{k + 1}")
        ax.plot(grid, mid, "-", color=f"C{k + 1}", lw=1.2, label=f"{row}: m {trend.predict(far)[0]:.2g} at {to_model}")
        ax.fill_between(grid, low, high, color=f"C{k + 1}", alpha=0.12)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axvline(far, color="grey", lw=0.8, ls=":")
    ax.text(far, ax.get_ylim()[1], f" {to_model}", va="top", ha="right", fontsize=8, color="grey")
    ax.set(xscale="log", yscale="log", xlabel="non-embedding parameters N",
           ylabel="effective-token multiplier m (data parallel = 1)",
           title="each strategy's multiplier by size, the trend the simulator reads, its 95% band")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, Path(path), dpi=110)
    plt.close(fig)
