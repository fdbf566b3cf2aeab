"""The report's ``convergence`` section on the console and in a figure.

The section itself (:mod:`oresearcher.sim.convergence`) holds the scaling law, the
measured efficiency with its seed band, the predicted final loss for the run's budget,
the time to the target loss and the curve; here it becomes lines, a sweep table ranked
by time to the target, and ``convergence.png`` (loss against hours, strategies overlaid).
"""
from __future__ import annotations

from rich.table import Table


def hours(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:,.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:,.1f} h"
    if seconds < 1e6 * 86400:
        return f"{seconds / 86400:,.1f} days"
    return f"{seconds / 86400:.3g} days"  # a tiny law.beta: 1e+190 days, not 190 digits


def count(n: int) -> str:
    """A step count with thousands separators, or in e-notation past 10^15 (a tiny law.beta)."""
    return f"{n:,}" if n < 1e15 else f"{n:.3g}"


def efficiency_text(c: dict) -> str:
    e = c["efficiency"]
    if not e["measured"]:
        return "1 (synchronous data parallel: the law's own regime)"
    if "ladder" in e:
        return f"{_m(e)} tokens, the ladder's {e['ladder']['row']} trend"
    p = e["proxy"]
    return (f"{e['multiplier']:.2f}x tokens [{e['low']:.2f}-{e['high']:.2f}], {p['seeds']} seed"
            f"{'s' if p['seeds'] > 1 else ''} of {p['model']} x {p['steps']} steps")


def _m(e: dict) -> str:
    """A ladder multiplier and its band: 3 significant digits (an extrapolation can be 1e-3)."""
    return f"{e['multiplier']:.3g}x [{e['low']:.3g}-{e['high']:.3g}]"


def size_caution(c: dict) -> list[str]:
    """Two lines when a measured multiplier comes from a proxy smaller than the model by
    more than the held-out check covers; none otherwise."""
    from oresearcher.models.convergence import CHECKED_SIZE_RATIO

    e = c["efficiency"]
    if "ladder" in e:
        return ladder_lines(e["ladder"])
    ratio = c["n_params"] / e["proxy"]["n_params"] if e["measured"] else 0.0
    if ratio <= CHECKED_SIZE_RATIO:
        return []
    return [f"  caution: the proxy is {ratio:,.0f}x smaller than the model; the held-out check",
            f"  covers {CHECKED_SIZE_RATIO:g}x, and there every multiplier fell with size (docs/convergence.md)"]


def ladder_lines(lad: dict) -> list[str]:
    """Where a ladder multiplier comes from, how far it is carried, and the published anchor."""
    made = lad.get("made_by") or {}
    commits = made.get("commit") or ""
    by = f" (bench_scaling.py, commit{'s' if ',' in commits else ''} {commits})" if commits else ""
    out = [f"  ladder: {lad['file']}{by}",
           f"  {lad['sizes']} sizes, N up to {lad['largest_n']:,.0f} (non-embedding); read {lad['distance']:,.0f}x past it",
           f"  ln m slope {lad['slope']:+.3f} per ln N; band: its 95% prediction interval"]
    if lad.get("published"):
        out.append(f"  {lad['published']}")
    x = lad.get("ddp_exponents")
    if x:
        out.append(f"  anchor: ladder's data parallel alpha {x['alpha']:.2f}, beta {x['beta']:.2f} "
                   "(Chinchilla 0.34, 0.28)")
    return out


def lines(c: dict) -> list[str]:
    """What the console prints about one run's convergence section (80 columns)."""
    law = c["law"]
    out = [f"convergence, base run: {law['source']}"]
    formula = f"L(N, D) = {law['E']:g} + {law['A']:g}/N^{law['alpha']:g} + {law['B']:g}/D^{law['beta']:g}"
    if "unavailable" in c:
        return out + [f"  {c['unavailable']}"]
    f = c["final"]
    out += [f"  {formula}; N = {c['n_params']:.3g}, floor {c['floor_loss']:.3f}",
            f"  efficiency {efficiency_text(c)}",
            *size_caution(c),
            f"  after {c['budget_steps']:,} steps ({f['tokens']:.3g} tokens, {hours(f['time_s'])}): loss "
            f"{f['loss']:.3f} [{f['loss_low']:.3f}-{f['loss_high']:.3f}]"]
    t = c.get("to_target")
    if t is not None:
        if t["steps"] is None:
            out.append(f"  time to loss {c['target_loss']:g}: {t['why']}")
        else:
            out.append(f"  time to loss {c['target_loss']:g}: {hours(t['time_s'])} [{hours(t['time_s_low'])}-"
                       f"{hours(t['time_s_high'])}], {count(t['steps'])} steps of {c['step_time_s'] * 1e3:,.1f} ms")
    return out


def beside_lines(c: dict, metrics: dict | None) -> list[str]:
    """A real run's loss curve (its report's ``metrics``: mean over agents, smoothed) beside
    the prediction at a few of its steps: what ``oresearcher.compare`` prints."""
    from oresearcher.models import convergence as cv

    if "unavailable" in c:
        return [f"loss: {c['unavailable']}"]
    curve = cv.mean_curve(metrics or {})
    if not curve:
        return ["loss: the measured run recorded no training loss"]
    law = cv.ScalingLaw(**{k: c["law"][k] for k in ("E", "A", "B", "alpha", "beta")})
    e, smooth = c["efficiency"], cv.smooth(curve, max(5, len(curve) // 30))
    out = [f"loss beside the prediction ({c['law']['source']}; efficiency {e['multiplier']:.2f}; "
           "measured: mean over agents, smoothed)"]
    for s in sorted({max(1, round(len(curve) * f)) for f in (0.1, 0.25, 0.5, 0.75, 1.0)}):
        p = [cv.loss(law, c["n_params"], s * c["tokens_per_step"], m) for m in (e["multiplier"], e["high"], e["low"])]
        out.append(f"  step {s:>8,}: predicted {p[0]:.3f} [{p[1]:.3f}-{p[2]:.3f}], measured {smooth[s - 1]:.3f} "
                   f"({p[0] / smooth[s - 1] - 1:+.1%})")
    return out


def _rank_key(c: dict):
    t = (c or {}).get("to_target") or {}
    return (t.get("time_s") is None, t.get("time_s") or 0.0)


def sweep_table(field: str, values: list, reports: list[dict]) -> Table:
    """One row per value, fastest to the target first (by time, not by step time)."""
    target = next((r["convergence"].get("target_loss") for r in reports), None)
    t = Table(title=f"sweep of {field}: predicted time to loss {target:g}" if target is not None
              else f"sweep of {field}: predicted final loss", header_style="bold")
    for col in (field.rsplit(".", 1)[-1], "step ms", "efficiency", "steps", "time", "final L"):
        t.add_column(col, justify="right", no_wrap=True)
    rows = sorted(zip(values, reports), key=lambda vr: _rank_key(vr[1]["convergence"]))
    for v, r in rows:
        c = r["convergence"]
        if "unavailable" in c:
            t.add_row(str(v), f"{r['step_time_s'] * 1e3:,.1f}", c["unavailable"], "", "", "")
            continue
        e, to = c["efficiency"], c.get("to_target") or {}
        eff = (f"{e['multiplier']:.2g} [{e['low']:.2g}, {e['high']:.2g}]" if "ladder" in e else
               f"{e['multiplier']:.2f} [{e['low']:.2f}-{e['high']:.2f}]") if e["measured"] else "1 (DDP)"
        steps = "" if not to else ("never" if to["steps"] is None else count(to["steps"]))
        t.add_row(str(v), f"{r['step_time_s'] * 1e3:,.1f}", eff, steps, hours(to.get("time_s")) if to else "",
                  f"{c['final']['loss']:.3f}")
    ladder = any("ladder" in (r["convergence"].get("efficiency") or {}) for r in reports)
    t.caption = ("efficiency: effective-token multiplier " + ("from the ladder's trend, its 95% prediction interval"
                 if ladder else "measured on the proxy, the range over seeds") + " bracketed; steps, time: to the "
                 "target; final L: loss after training.steps")
    cautions = (size_caution(r["convergence"]) for r in reports if "unavailable" not in r["convergence"])
    caution = next((c for c in cautions if c), None)
    if caution:
        t.caption += "; " + "; ".join(line.strip() for line in caution)
    return t


def figure(curves: list[tuple[str, dict]], path, title: str) -> bool:
    """Predicted loss against hours, one line and band per (label, section); False if
    no section has a curve (nothing written)."""
    drawable = [(label, c) for label, c in curves if c.get("curve")]
    if not drawable:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, c in drawable:
        xs = [p["time_s"] / 3600 for p in c["curve"]]
        line, = ax.plot(xs, [p["loss"] for p in c["curve"]], label=label)
        ax.fill_between(xs, [p["loss_low"] for p in c["curve"]], [p["loss_high"] for p in c["curve"]],
                        color=line.get_color(), alpha=0.2, lw=0)
    target = drawable[0][1].get("target_loss")
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xscale("log")
    ax.set_xlabel("simulated wall-clock time (hours)")
    ax.set_ylabel("predicted loss (nats per token)")
    lo = min(p["loss_low"] for _, c in drawable for p in c["curve"])
    top = max(lo + 2.0, (target or lo) + 1.0)
    ax.set_ylim(lo - 0.1, top)
    seen = [p["time_s"] / 3600 for _, c in drawable for p in c["curve"] if p["loss_low"] <= top and p["time_s"] > 0]
    if seen:  # from where the first curve comes into view (the first steps' loss is off the chart)
        ax.set_xlim(left=min(seen) / 1.5)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    from oresearcher.files import save_figure

    save_figure(fig, path, dpi=110)  # atomic: a link planted at convergence.png is replaced, not followed
    return True
