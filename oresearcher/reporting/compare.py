"""Prediction beside measurement, figure by figure: reading and checking two report.json
files, the relative errors, and the table (the command is :mod:`oresearcher.compare`).

In flight and exposed are defined in :mod:`oresearcher.reporting.report`. On a real run
exposed can exceed in flight: a collective is in flight from its issue until the wire
work completes, while the rank is blocked from the issue until it holds the result, which
includes the host work around it (copying the payload in, gloo's averaging division,
unpacking gathered tensors). Waiting for slower peers is in both.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..errors import UserError, short
from .units import format_bytes

FIGURES = (
    ("step_time_s", "step time", "s"),
    ("compute_time_s", "compute time", "s"),
    ("comm_time_s", "comm in flight (issue to completion)", "s"),
    ("exposed_comm_time_s", "exposed comm (rank blocked)", "s"),
    ("comm_overhead", "communication overhead", "%"),
    ("wire_bytes_per_step", "bytes on the wire per rank", "B"),
)
HEADLINE = ("step_time_s", "comm_overhead")


def read_report(path: str | Path) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    if not p.is_file():
        raise UserError(f"{path}: no report.json there")
    from ..files import Unreadable, read_json

    try:
        report = read_json(p)
    except (Unreadable, OSError) as e:
        raise UserError(f"{p}: not a JSON report ({short(str(e), 120)})") from None
    if not isinstance(report, dict):
        raise UserError(f"{p}: not a report: a JSON {type(report).__name__}, not an object")
    missing = [k for k, _, _ in FIGURES if k not in report]
    if missing:
        raise UserError(f"{p}: not a report: missing {', '.join(missing)}")
    for k, _, _ in FIGURES:  # a NaN or a negative time would pass or fail a --max-error gate silently
        v = report[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise UserError(f"{p}: {k} is {short(v, 60)}; a report's figures are finite numbers >= 0")
    for key, kind in (("scenario", dict), ("world_size", int)):
        if report.get(key) is not None and (not isinstance(report[key], kind) or isinstance(report[key], bool)):
            raise UserError(f"{p}: {key} is {short(report[key], 60)}; expected a {kind.__name__}")
    training = (report.get("scenario") or {}).get("training")
    if training is not None and not isinstance(training, dict):
        raise UserError(f"{p}: scenario.training is {short(training, 60)}; expected a mapping")
    if report.get("convergence") is not None:
        check_convergence(report["convergence"], p)
    if report.get("metrics") is not None:
        check_metrics(report["metrics"], p)
    return report


def _number(v, positive: bool = False) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (v > 0 if positive else True))


def check_convergence(c, p: Path) -> None:
    """The fields of a report's ``convergence`` section that compare reads
    (:func:`oresearcher.reporting.convergence_view.beside_lines`), each checked: a damaged
    section is one line naming the field, never a traceback or a ``nan`` in the output."""
    def bad(field, value, want):
        what = "missing" if value is None else f"{short(value, 60)}"
        raise UserError(f"{p}: {'.'.join(('convergence', field)).rstrip('.')} is {what}; expected {want}")

    if not isinstance(c, dict):
        bad("", c, "a mapping (the section oresearcher.sim --target-loss writes)")
    law = c.get("law")
    if not isinstance(law, dict):
        bad("law", law, "a mapping of E, A, B, alpha, beta")
    for k in ("E", "A", "B", "alpha", "beta"):
        if not _number(law.get(k), positive=k in ("B", "alpha", "beta")) or law.get(k) < 0:
            bad(f"law.{k}", law.get(k), "a finite number" + (" > 0" if k in ("B", "alpha", "beta") else " >= 0"))
    if not isinstance(law.get("source", ""), str):
        bad("law.source", law.get("source"), "text")
    if "unavailable" in c:
        if not isinstance(c["unavailable"], str):
            bad("unavailable", c["unavailable"], "text")
        return
    for k in ("n_params", "tokens_per_step"):
        if not _number(c.get(k), positive=True):
            bad(k, c.get(k), "a finite number > 0")
    e = c.get("efficiency")
    if not isinstance(e, dict):
        bad("efficiency", e, "a mapping")
    for k in ("multiplier", "low", "high"):
        if not _number(e.get(k), positive=True):
            bad(f"efficiency.{k}", e.get(k), "a finite number > 0")


def check_metrics(metrics, p: Path) -> None:
    """A report's per-rank ``metrics`` (rank -> rows of {step, loss, ...}), as compare
    reads them for the loss beside a prediction."""
    if not isinstance(metrics, dict) or not all(isinstance(rows, list) for rows in metrics.values()):
        raise UserError(f"{p}: metrics is {short(metrics, 60)}; expected rank -> list of rows")
    for rank, rows in metrics.items():
        for row in rows:
            loss = row.get("loss") if isinstance(row, dict) else None  # NaN: a diverged step, skipped
            ok = (isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool)
                  and (loss is None or (isinstance(loss, (int, float)) and not isinstance(loss, bool))))
            if not ok:
                raise UserError(f"{p}: metrics[{short(rank, 20)}] holds {short(row, 60)}; expected rows with "
                                "an integer step and a numeric loss")


MISMATCH = (("scenario", lambda r: (r.get("scenario") or {}).get("name")),
            ("strategy", lambda r: ((r.get("scenario") or {}).get("training") or {}).get("strategy")),
            ("rank count", lambda r: r.get("world_size")))
NOTE = "exposed: rank blocked, incl. host work on the result; in flight: issue to done"  # < 80 columns


def mismatch(predicted: dict, measured: dict) -> str | None:
    """What makes two reports incomparable (scenario name, strategy, rank count), or None.
    A figure a report does not record is not held against it."""
    for what, get in MISMATCH:
        a, b = get(predicted), get(measured)
        if a is not None and b is not None and a != b:
            return f"{what} {a} against {b}"
    return None


def relative_error(predicted: float, measured: float):
    """(predicted - measured) / measured; None when nothing was measured."""
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def compare(predicted: dict, measured: dict) -> list[dict]:
    """One row per figure: key, label, predicted, measured, error."""
    return [{"key": k, "label": label, "unit": unit, "predicted": predicted.get(k), "measured": measured.get(k),
             "error": relative_error(predicted.get(k), measured.get(k))} for k, label, unit in FIGURES]


def fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{100 * value:.2f}%"
    if unit == "s":
        return f"{1e3 * value:,.3f} ms"
    return format_bytes(value)  # as the run's own table prints it


def worst_headline(rows: list[dict]) -> float:
    errs = [abs(r["error"]) for r in rows if r["key"] in HEADLINE and r["error"] is not None]
    return max(errs, default=0.0)


BAND_FIGURES = (("step_time_s", "step time", "s", "step_time"), ("comm_overhead", "overhead", "%", "comm_overhead"))


def band(value: float, half_width: float) -> tuple[float, float]:
    """(low, high) of a band of relative ``half_width`` around ``value`` (the half widths
    come from calibration, oresearcher/calibration/band.py; the simulator reports the band)."""
    return value * max(0.0, 1.0 - half_width), value * (1.0 + half_width)


def band_verdicts(predicted: dict, measured: dict) -> list[dict]:
    """For each headline figure the prediction carries a band for (a calibrated profile's,
    oresearcher/calibration/band.py): key, label, unit, low, high, half width, measured, and
    whether the measured figure lies inside."""
    b = predicted.get("band")
    if not isinstance(b, dict):
        return []
    out = []
    for key, label, unit, width in BAND_FIGURES:
        lo_hi, m = b.get(key), measured.get(key)
        if not (isinstance(lo_hi, list) and len(lo_hi) == 2) or m is None:
            continue
        w = (b.get("half_width") or {}).get(width)
        out.append({"key": key, "label": label, "unit": unit, "low": lo_hi[0], "high": lo_hi[1], "half_width": w,
                    "measured": m, "inside": lo_hi[0] <= m <= lo_hi[1]})
    return out


def band_lines(predicted: dict, measured: dict) -> list[str]:
    """One line per banded figure: the measured figure inside or outside the predicted band."""
    lines = []
    for v in band_verdicts(predicted, measured):
        w = f" (+-{v['half_width']:.0%})" if v["half_width"] is not None else ""
        lines.append(f"{v['label']}: measured {fmt(v['measured'], v['unit'])} "
                     f"{'inside' if v['inside'] else 'OUTSIDE'} the predicted band "
                     f"{fmt(v['low'], v['unit'])} - {fmt(v['high'], v['unit'])}{w}, from calibration's spread")
    return lines


def profile_lines(predicted: dict, measured: dict) -> list[str]:
    """Which hardware profiles the prediction priced the run with (the report's saved
    ``cluster``) and, when they are the shipped ones (``oresearcher/hardware/profiles``: published or rough
    figures, not this machine), the command that measures this machine instead. An
    uncalibrated prediction of a CPU run can be off by a factor; the table alone does not
    say whether the model or its inputs are wrong."""
    from ..hardware import builtin_profiles

    cluster = (predicted.get("scenario") or {}).get("cluster")
    if not isinstance(cluster, dict) or predicted.get("backend") != "sim":
        return []
    shipped = dict(builtin_profiles())
    named = [("device", str(cluster.get("device") or "").partition(":")[0]),
             ("fabric", str(cluster.get("intra_node") or ""))]
    if cluster.get("inter_node"):
        named.append(("fabric", str(cluster["inter_node"])))
    files = cluster.get("profile_files") or []
    default = [n for kind, n in named if (kind, n) in shipped]
    names = ", ".join(n[:60] for _, n in named)
    if not default:
        return [f"prediction priced with profiles {names} from {', '.join(map(str, files))[:120]}"]
    name = str((predicted.get("scenario") or {}).get("name", "S"))[:64]
    backend = measured.get("backend") if measured.get("backend") in ("gloo", "nccl") else "gloo"
    return [f"prediction priced with shipped profiles {names} (oresearcher/hardware/profiles), not this host's",
            f"calibrate: python -m oresearcher.calibrate --backend={backend} --scenario scenarios/{name}.yaml",
            f"then predict with runs/{name}/profile.yaml (docs/calibration.md, 'The chain')"]


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, header_style="bold")
    for col in ("per step (mean over ranks)", "predicted", "measured", "error"):
        t.add_column(col, justify="right" if col != "per step (mean over ranks)" else "left")
    for r in rows:
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        t.add_row(r["label"], fmt(r["predicted"], r["unit"]), fmt(r["measured"], r["unit"]), err)
    console = Console(markup=False)  # names and values are the user's text, printed as typed
    console.print(t)
    console.print(NOTE, highlight=False)
