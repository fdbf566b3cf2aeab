"""Put the simulator's prediction beside a real run's measurement, figure by figure.

    python -m oresearcher.compare runs/local-gloo/report.json runs/local-gloo/gloo/report.json
    python -m oresearcher.compare runs/local-gloo runs/local-gloo/gloo --max-error 0.15

Each argument is a report.json or a directory holding one. The error of a figure is
``(predicted - measured) / measured``. With ``--max-error``, the exit code is 1 when a
headline figure (step time, communication overhead) is off by more than that fraction.
Reports of different scenarios, strategies or rank counts are refused (one line, exit 2)
unless ``--force`` says the comparison is meant. A prediction made with a calibrated
profile carries a band (oresearcher/calibration/band.py); each headline figure's line then
says whether the measurement lies inside it.

"""
from __future__ import annotations

import argparse
import math
import sys

from .errors import Parser, UserError, cli_main, short
from .reporting.compare import (band_lines, compare, mismatch, print_table, profile_lines, read_report,
                                worst_headline)


def _fraction(text: str) -> float:
    """--max-error: a finite fraction >= 0 (NaN would make every comparison pass)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{short(text, 40)} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{short(text, 40)}: expected a finite fraction >= 0 (0.15 is 15%)")
    return v


def main(argv=None) -> int:
    p = Parser(prog="python -m oresearcher.compare", description=__doc__.split("\n")[0])
    p.add_argument("predicted", help="the simulator's report.json (or its directory)")
    p.add_argument("measured", help="the real run's report.json (or its directory)")
    p.add_argument("--max-error", type=_fraction, help="exit 1 if step time or overhead is off by more (a fraction)")
    p.add_argument("--force", action="store_true",
                   help="compare reports of different scenarios, strategies or rank counts anyway")
    args = p.parse_args(argv)
    pred, meas = read_report(args.predicted), read_report(args.measured)
    differ = mismatch(pred, meas)
    if differ and not args.force:
        raise UserError(f"{args.predicted} and {args.measured} are different runs ({differ}); "
                        f"pass --force to compare them anyway")
    rows = compare(pred, meas)
    name = (meas.get("scenario") or {}).get("name", "")
    print_table(rows, f"{name}: {pred.get('backend', '?')} prediction vs {meas.get('backend', '?')} "
                      f"measurement, {meas.get('world_size', '?')} ranks")
    print("\n".join(band_lines(pred, meas) + profile_lines(pred, meas)))
    if pred.get("convergence"):  # the predicted loss curve (oresearcher.sim's --target-loss) beside the run's
        from .reporting.convergence_view import beside_lines

        print("\n".join(beside_lines(pred["convergence"], meas.get("metrics"))))
    if args.max_error is not None and worst_headline(rows) > args.max_error:
        print(f"error: a headline figure is off by {worst_headline(rows):.1%} (> {args.max_error:.0%})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main))
