"""The reading half of bench_scaling: the ladder's stored runs -> fitted laws, intervals,
residuals, the held-out check, the figure. Trains nothing (docs/scaling.md).

Which run stands for (strategy, size): the full-budget runs (the most steps stored) at the
size's tuned rate (data parallel's lowest validation loss at the first seed), and of those,
one per seed, the seed with the median validation loss. Data parallel's shorter runs at the
tuned rate are Chinchilla's other D.
"""
from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

from oresearcher.files import read_json, write_text
from oresearcher.models import convergence as cv
from oresearcher.models import scaling_laws as S
from oresearcher.tasks.text.pretrain import lr_at

CURVE_POINTS = 60  # points per curve the whole-curve law is fitted to (log-spaced after warm-up)
DRAWS = 200  # bootstrap draws of each size law
TARGET_AT = 5 / 6  # the target: the held-out run's smoothed loss here, inside its last third
HELD_OUT_FACTOR = 4  # a held-out size is at least this many times every size its laws are fitted on
MIN_FITTED = 4  # sizes a held-out check fits on, at least


def pick(runs: list[dict]) -> tuple[dict, dict, list, dict]:
    """({strategy: {model: run}}, {model: tuned rate}, data parallel's shorter runs,
    {strategy: {model: [the same run at the other seeds]}}). Tuning uses the first seed; per
    (strategy, size) the run standing for it is then the seed with the median validation
    loss (the fits' point and curve), the other seeds join the held-out check's median."""
    base = min((r["seed"] for r in runs), default=0)
    by, seeds = {}, {}
    for r in (r for r in runs if r["seed"] == base):
        by.setdefault(r["strategy"], {}).setdefault(r["model"], []).append(r)
    chosen, tuned, shorter = _tune(by)
    for r in runs:
        c = chosen.get(r["strategy"], {}).get(r["model"])
        if c and r["lr"] == c["lr"] and r["steps"] == c["steps"]:
            seeds.setdefault(r["strategy"], {}).setdefault(r["model"], []).append(r)
    extra = {}
    for strategy, models in seeds.items():
        for model, rs in models.items():
            rs = sorted(rs, key=lambda r: r["val_loss"])
            middle = rs[(len(rs) - 1) // 2]
            chosen[strategy][model] = middle
            extra.setdefault(strategy, {})[model] = [r for r in rs if r is not middle]
    return chosen, tuned, shorter, extra


def _tune(by: dict) -> tuple[dict, dict, list]:
    """Data parallel's best full-budget rate per size, the run standing for each (strategy,
    size) at it, and data parallel's shorter runs at it."""
    tuned, chosen, shorter = {}, {}, []
    for model, rs in by.get("ddp", {}).items():
        full = max(r["steps"] for r in rs)
        best = min((r for r in rs if r["steps"] == full), key=lambda r: r["val_loss"])
        tuned[model] = best["lr"]
        shorter += [r for r in rs if r["steps"] < full and r["lr"] == best["lr"]]
    for strategy, models in by.items():
        for model, rs in models.items():
            ok = [r for r in rs if r["lr"] == tuned.get(model)]
            if ok:
                full = max(r["steps"] for r in ok)
                chosen.setdefault(strategy, {})[model] = next(r for r in ok if r["steps"] == full)
    return chosen, tuned, shorter


def schedule(run: dict) -> np.ndarray:
    """The rates of a run's optimizer steps (the base rate: roles scale it further)."""
    return np.array([lr_at(i, run["steps"], run["lr"]) for i in range(run["steps"])])


def curve_points(run: dict, gamma: float = 1.0, ref: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S1, S2, loss) at log-spaced steps after warm-up, the schedule read at ``gamma`` against
    rate ``ref`` (S.at_rate); curve[i] is the loss after i updates."""
    s1, s2 = S.areas(S.at_rate(schedule(run), gamma, ref))
    loss = np.asarray(updates(run), float)
    first = max(1, int(round(0.1 * run["steps"])))
    idx = np.unique(np.geomspace(first, len(loss) - 1, CURVE_POINTS).astype(int))
    return s1[idx - 1], s2[idx - 1], loss[idx]


def fit_size(runs: list[dict], draws: int = DRAWS) -> S.Fit:
    n = np.array([r["n"] for r in runs], float)
    loss = np.array([r["val_loss"] for r in runs], float)
    fit = S.fit_power(n, loss)
    if len(runs) <= 3 or draws == 0:  # as many coefficients as points: no residual scatter to resample
        return fit
    return S.bootstrap(lambda x, y: S.fit_power(x, y, grid=S.grid_near(fit)), (n,), loss, fit, draws=draws)


def fit_curve(runs: list[dict], gamma: float = 1.0, ref: float | None = None) -> S.Fit:
    cols = [(np.full(len(p[0]), r["n"]),) + p for r in runs for p in [curve_points(r, gamma, ref)]]
    n, s1, s2, loss = (np.concatenate(c) for c in zip(*cols))
    return S.fit_curves(n, s1, s2, loss)


def split(runs: dict, held: str | None = None) -> tuple[list[dict], dict] | None:
    """(the fitted sizes' runs, the held-out size's run) of a held-out check at ``held``
    (default: the largest size): the laws are fitted on every size at most 1 /
    :data:`HELD_OUT_FACTOR` of it; None with fewer than :data:`MIN_FITTED` such sizes."""
    order = sorted(runs.values(), key=lambda r: r["n"])
    if not order or (held is not None and held not in runs):
        return None
    target = runs[held] if held is not None else order[-1]
    fitted = [r for r in order if r["n"] * HELD_OUT_FACTOR <= target["n"]]
    return (fitted, target) if len(fitted) >= MIN_FITTED else None


def held_out_sizes(runs: dict) -> list[str]:
    """Every size a held-out check can stand at (:func:`split`), the largest last."""
    return [r["model"] for r in sorted(runs.values(), key=lambda r: r["n"]) if split(runs, r["model"])]


def rate_exponent(runs: list[dict], chosen_ddp: dict, held: str | None = None) -> dict | None:
    """The curve law's rate exponent gamma (S.profile_rate), profiled on data parallel's runs
    at the sizes the held-out check at ``held`` (default: the largest size) fits on (every
    stored rate, budget and seed: the tuning grid is where the peak rate varies), against the
    largest fitted size's tuned rate. None without such a check or two peak rates."""
    parts = split(chosen_ddp, held)
    if parts is None:
        return None
    ref = parts[0][-1]["lr"]
    pts = [r for r in runs if r["strategy"] == "ddp" and r["n"] <= parts[0][-1]["n"]]
    rates = sorted({r["lr"] for r in pts})
    if len(rates) < 2:
        return None
    gamma, objectives = S.profile_rate(lambda g: fit_curve(pts, g, ref))
    return {"gamma": gamma, "ref": ref, "objectives": {str(g): v for g, v in objectives.items()},
            "rates": rates, "runs": len(pts)}


def read_at(rate: dict | None) -> tuple[float, float | None]:
    """(gamma, ref) the curve laws read schedules at: :func:`rate_exponent`'s, else the paper's
    gamma 1."""
    return (rate["gamma"], rate["ref"]) if rate else (1.0, None)


def seed_band(fitted: list[dict], others: dict, n: float, start: S.Fit,
              q: tuple = (2.5, 97.5)) -> tuple[float, float] | None:
    """The spread of the size law's prediction at ``n`` from the seeds: refitted on every
    choice of one seed per fitted size (``others``: {model: its runs at the other seeds}),
    the ``q`` percentiles of the predictions, each refit started from ``start`` (the fit of
    the median seeds), as a bootstrap draw is. None with one seed per size."""
    options = [[r, *others.get(r["model"], [])] for r in fitted]
    combos = list(itertools.product(*options))
    if len(combos) < 2:
        return None
    preds = []
    for combo in combos:
        x = np.array([r["n"] for r in combo], float)
        y = np.array([r["val_loss"] for r in combo], float)
        preds.append(float(S.power_law(n, **S.fit_power(x, y, grid=S.grid_near(start)).coef)))
    lo, hi = np.percentile(preds, q)
    return float(lo), float(hi)


def held_out(runs: dict, seeds_of: dict | None = None, rate: dict | None = None,
             at: str | None = None) -> dict | None:
    """Fit on the sizes :func:`split` gives for the size ``at`` (default: the largest); predict
    its final loss and steps to a target; measured: the median over its seeds. ``seeds_of``:
    {model: its runs at the other seeds}, the held-out size's for that median, the fitted
    sizes' for the prediction's seed band (:func:`seed_band`). The target is the smoothed loss
    at :data:`TARGET_AT` of the run of the seed with the median final loss, so the median seed
    crosses it in its last third; a seed that never crosses counts as past the run. ``rate``:
    the curve law's rate exponent (:func:`rate_exponent`); None reads schedules as Tissue et
    al. do (gamma 1)."""
    parts = split(runs, at)
    if parts is None:
        return None
    fitted, held = parts
    size = fit_size(fitted, draws=0)
    pred_loss = float(S.power_law(held["n"], **size.coef))
    seeds_of = seeds_of or {}
    band = seed_band(fitted, seeds_of, held["n"], size)
    seeds = [held, *seeds_of.get(held["model"], [])]
    middle = sorted(seeds, key=lambda r: r["val_loss"])[(len(seeds) - 1) // 2]  # the median seed's run
    smooth = _smooth(middle)
    target = smooth[int(TARGET_AT * (len(smooth) - 1))]
    crossings = [next((i for i, v in enumerate(_smooth(r)) if v <= target), None) for r in seeds]
    measured = float(np.median([math.inf if c is None else c for c in crossings]))  # never: past the run
    measured = None if math.isinf(measured) else measured  # the median seed never got there
    final = float(np.median([r["val_loss"] for r in seeds]))
    gamma, ref = read_at(rate)
    coef = fit_curve(fitted, gamma, ref).coef
    lrs = S.at_rate(schedule(held), gamma, ref)
    pred_steps = S.steps_to(coef, held["n"], lrs, target)
    s1, s2 = S.areas(lrs)
    at = np.unique(np.geomspace(1, len(smooth) - 1, 50).astype(int))  # curve[i]: after i updates (the cooperative
    # program records fewer steps than training.steps where its allocation gave the last round fewer)
    return {"curve": {"step": at.tolist(), "measured": [smooth[i] for i in at],
                      "predicted": S.curve_law(held["n"], s1[at - 1], s2[at - 1], **coef).tolist()},
            "curve_coef": coef, "gamma": gamma, "model": held["model"], "n": held["n"], "largest_fitted_n": fitted[-1]["n"],
            "seeds": [r["seed"] for r in seeds], "final_losses": [r["val_loss"] for r in seeds],
            "steps_per_seed": crossings, "final_loss": final, "predicted_loss": pred_loss,
            "final_error": pred_loss / final - 1, "band": band, "curve_final": float(S.curve_law(
                held["n"], s1[-1], s2[-1], **coef)), "target": target, "steps": measured,
            "predicted_steps": pred_steps,
            "steps_error": None if pred_steps is None or measured is None else pred_steps / measured - 1}


def _smooth(run: dict) -> list[float]:
    return cv.smooth(updates(run), max(5, run["steps"] // 30) | 1)


def updates(run: dict) -> list[float]:
    """The run's curve within its schedule: the cooperative program's mean curve can run a few
    steps past ``training.steps`` (an agent whose compute share gave it more updates), where
    the schedule, and so the whole-curve law's areas, ends."""
    return run["curve"][: run["steps"]]


def fit_chinchilla(ddp: dict, shorter: list[dict]) -> S.Fit | None:
    pts = list(ddp.values()) + shorter
    if len({r["steps"] / r["n"] for r in pts}) < 2 or len(pts) < 6:
        return None  # one D per N: Chinchilla's two terms cannot be told apart
    n = np.array([r["n"] for r in pts], float)
    d = np.array([r["steps"] * r["tokens_per_step"] for r in pts], float)
    loss = np.array([r["val_loss"] for r in pts], float)
    fit = S.fit_chinchilla(n, d, loss)
    return S.bootstrap(lambda a, b, y: S.fit_chinchilla(a, b, y, grid=S.grid_near(fit)), (n, d), loss, fit,
                       draws=DRAWS // 2)


def multipliers(chosen: dict, chin: S.Fit | None) -> dict:
    """Per strategy and size: the loss ratio to data parallel and, through data parallel's
    Chinchilla fit, the effective-token multiplier m: the tokens the fit says data parallel
    needs for the strategy's loss over those it says data parallel needs for its own (1 for
    data parallel; the law's residual cancels)."""
    out, ddp = {}, chosen.get("ddp", {})
    for strategy, models in chosen.items():
        for model, r in sorted(models.items(), key=lambda kv: kv[1]["n"]):
            if model not in ddp:
                continue
            row = {"n": r["n"], "loss_ratio": r["val_loss"] / ddp[model]["val_loss"]}
            if chin is not None:
                row["m"] = tokens_for(chin.coef, r["n"], r["val_loss"]) / tokens_for(chin.coef, r["n"],
                                                                                     ddp[model]["val_loss"])
            out.setdefault(strategy, []).append(row)
    return out


def tokens_for(c: dict, n: float, loss: float) -> float:
    """D with E + A / n^alpha + B / D^beta = loss (inf at or below the size's floor)."""
    gap = loss - c["E"] - c["A"] / n ** c["alpha"]
    return (c["B"] / gap) ** (1 / c["beta"]) if gap > 0 else math.inf


def fmt_fit(fit: S.Fit) -> str:
    parts = []
    for k, v in fit.coef.items():
        lo_hi = fit.interval.get(k)
        parts.append(f"{k} {v:.4g}" + (f" [{lo_hi[0]:.4g}, {lo_hi[1]:.4g}]" if lo_hi else ""))
    res = np.abs(np.asarray(fit.residuals))
    return (f"{', '.join(parts)}; residuals |log| max {res.max():.4f}, rms {math.sqrt(np.mean(res ** 2)):.4f}; "
            f"{fit.converged}/{fit.starts} starts at the optimum")


def report(ladder: dict) -> dict:
    """Every fit and check of a stored ladder (JSON-ready)."""
    runs = list(ladder["runs"].values())
    chosen, tuned, shorter, extra = pick(runs)
    ddp = chosen.get("ddp", {})
    rate = rate_exponent(runs, ddp)
    gamma, ref = read_at(rate)
    out = {"tuned_lr": tuned, "size_law": {}, "curve_law": {}, "held_out": {}, "points": {}, "rate": rate,
           "held_out_smaller": {}}
    smaller = {at: rate_exponent(runs, ddp, at) for at in held_out_sizes(ddp)[:-1]}
    for strategy, models in chosen.items():
        rs = sorted(models.values(), key=lambda r: r["n"])
        out["points"][strategy] = [{"model": r["model"], "n": r["n"], "tokens": r["steps"] * r["tokens_per_step"],
                                    "val_loss": r["val_loss"], "lr": r["lr"]} for r in rs]
        if len(rs) >= 3:
            out["size_law"][strategy] = fit_size(rs).as_dict()
            out["curve_law"][strategy] = fit_curve(rs, gamma, ref).as_dict()
        out["held_out"][strategy] = held_out(models, extra.get(strategy), rate)
        for at, its_rate in smaller.items():
            if at in models:
                out["held_out_smaller"].setdefault(at, {})[strategy] = held_out(models, extra.get(strategy), its_rate, at)
    chin = fit_chinchilla(chosen.get("ddp", {}), shorter)
    out["chinchilla_ddp"] = None if chin is None else chin.as_dict()
    out["multipliers"] = multipliers(chosen, chin)
    out["trend_held_out"] = trend_held_out(out["multipliers"])
    return out


def trend_held_out(rows: dict) -> dict:
    """The simulator's own extrapolation checked: per strategy, the straight line in (ln N,
    ln m) fitted on the sizes at most 1 / :data:`HELD_OUT_FACTOR` of the largest
    (oresearcher.models.ladder_law), read at the largest, beside the largest's measured m and
    whether its 95% band holds it."""
    from oresearcher.models.ladder_law import Trend

    out = {}
    for row, pts in rows.items():
        pts = sorted((p["n"], p["m"]) for p in pts if p.get("m") and math.isfinite(p["m"]) and p["m"] > 0)
        if row == "ddp" or not pts:
            continue
        (n, m), fitted = pts[-1], [p for p in pts if p[0] * HELD_OUT_FACTOR <= pts[-1][0]]
        if len(fitted) < 3:
            continue
        mid, low, high = Trend.fit(*zip(*fitted)).predict(n)
        out[row] = {"n": n, "measured": m, "predicted": mid, "low": low, "high": high, "inside": low <= m <= high,
                    "error": mid / m - 1}
    return out


def print_report(out: dict, made_by: list) -> None:
    for m in made_by:
        print(f"ladder made by: {m['command']} (commit {m['commit'][:10]}, host {m['host']}, torch {m['torch']})")
    print("tuned rates (data parallel): " + ", ".join(f"{k} {v:g}" for k, v in
                                                      sorted(out["tuned_lr"].items(), key=lambda kv: kv[1])))
    for strategy, pts in out["points"].items():
        print(f"{strategy:12s} " + "  ".join(f"{p['model']} {p['val_loss']:.4f}" for p in pts))
    for strategy, fit in out["size_law"].items():
        print(f"size law {strategy}: L(N) = A N^-alpha + C: {fmt_fit(S.Fit(**fit_args(fit)))}")
    rate = out.get("rate")
    if rate:
        print(f"curve law's rate exponent gamma {rate['gamma']:g} (schedules scaled by (peak / {rate['ref']:g})^(gamma - 1);"
              f" profiled on data parallel's {rate['runs']} runs at rates {', '.join(f'{x:g}' for x in rate['rates'])}):"
              " objective by gamma " + ", ".join(f"{g} {v:.5f}" for g, v in rate["objectives"].items()))
    for strategy, fit in out["curve_law"].items():
        print(f"curve law {strategy}: {fit['form']}: " + ", ".join(f"{k} {v:.4g}" for k, v in fit["coef"].items()))
    chin = out["chinchilla_ddp"]
    if chin:
        print(f"Chinchilla form, data parallel: {fmt_fit(S.Fit(**fit_args(chin)))}")
        print(f"  beside Hoffmann et al. 2022 (their data, tokenizer, N with embeddings): alpha "
              f"{chin['coef']['alpha']:.3f} vs 0.34, beta {chin['coef']['beta']:.3f} vs 0.28")
    for strategy, rows in out["multipliers"].items():
        if strategy != "ddp":
            print(f"{strategy} vs data parallel: " + "  ".join(
                f"N {r['n']:,}: loss x{r['loss_ratio']:.4f}" + (f", m {r['m']:.2f}" if "m" in r else "")
                for r in rows))
    for row, t in out.get("trend_held_out", {}).items():
        print(f"held-out trend {row}: m at N {t['n']:,} predicted {t['predicted']:.3g} [{t['low']:.3g}-{t['high']:.3g}],"
              f" measured {t['measured']:.3g} ({100 * t['error']:+.0f}%; {'inside' if t['inside'] else 'outside'} the band)")
    for at, rows in out.get("held_out_smaller", {}).items():
        for strategy, h in rows.items():
            print_held_out(f"held-out at {at}, a smaller check, {strategy}", h)
    for strategy, h in out["held_out"].items():
        print_held_out(f"held-out {strategy}", h)


def print_held_out(label: str, h: dict | None) -> None:
    if h is None:
        print(f"{label}: fewer than {MIN_FITTED} sizes {HELD_OUT_FACTOR}x below the largest, no check")
        return
    steps = ("none: the median seed never reaches the target" if h["steps"] is None else
             "none: never reached (predicted)" if h["steps_error"] is None else f"{100 * h['steps_error']:+.1f}%")
    band = h.get("band")
    band = "" if band is None else (f" [seeds' band {band[0]:.4f}-{band[1]:.4f}: measured "
                                    f"{'inside' if band[0] <= h['final_loss'] <= band[1] else 'outside'}]")
    print(f"{label}: final loss error {100 * h['final_error']:+.1f}%, steps to target error {steps}"
          f"  ({h['model']}, {h['n'] / h['largest_fitted_n']:.1f}x the largest fitted, {len(h['seeds'])} seed(s):"
          f" loss {h['final_loss']:.4f} predicted {h['predicted_loss']:.4f}{band}; curve law's final "
          f"{h['curve_final']:.4f}; target {h['target']:.3f} at step "
          f"{'-' if h['steps'] is None else format(h['steps'], 'g')}, predicted {h['predicted_steps']}; seeds' steps {h['steps_per_seed']})")


def fit_args(d: dict) -> dict:
    return {"form": d["form"], "coef": d["coef"], "objective": d["objective"], "starts": d["starts"],
            "converged": d["converged"], "residuals": tuple(d["residuals"]),
            "interval": {k: tuple(v) for k, v in d["interval"].items()}}


def check(path: Path, figure: Path | None = None, fits: Path | None = None) -> int:
    """Print the fits and the held-out check of the ladder at ``path``; write the fits to
    ``fits`` (default: beside it)."""
    if not Path(path).is_file():
        print(f"error: {path}: no ladder results (train them with --run)", file=sys.stderr)
        return 2
    ladder = read_json(Path(path))
    out = report(ladder)
    print_report(out, ladder.get("made_by", []))
    if fits is None:
        fits = Path(path).with_name(Path(path).stem.replace("ladder", "fits") + ".json")
        if fits == Path(path):
            fits = Path(path).with_suffix(".fits.json")
    write_text(fits, json.dumps({"source": str(path), "made_by": ladder.get("made_by", []), **out}, indent=1,
                                sort_keys=True) + "\n")
    print(f"wrote {fits}")
    if figure is not None:
        from scaling_figure import draw, draw_trend

        draw(out, figure)
        trend = figure.with_name(figure.stem + "-trend" + figure.suffix)
        draw_trend(out, trend)
        print(f"wrote {figure}, {trend}")
    return 0
