"""A strategy's effective-token multiplier as a function of model size, read from a
measured size ladder (``benchmarks/bench_scaling.py --check`` writes the fits file) and
extrapolated to the scenario's N: pure math over the file's numbers.

The ladder gives, per strategy and size, m = the tokens data parallel's fitted Chinchilla
form needs to reach the strategy's final loss over the tokens it needs for data parallel's
own (docs/scaling.md). Across sizes the trend is a straight line in (ln N, ln m), fitted by
least squares; DiLoCo's scaling-law study (arXiv 2503.09799) fits its gaps to data parallel
as power laws in N in the same way.

**The band** is the regression's 95% prediction interval of ln m at ln N (Student's t with
n - 2 degrees of freedom): ``t * s * sqrt(1 + 1/n + (ln N - mean ln N)^2 / Sxx)``, s the
residual standard deviation. It widens with the distance between the scenario's N and the
ladder's sizes, as the square of the log-distance under the root: read four orders of
magnitude past a ladder that spans one, the band says so by its width.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

# the ladder that ships: benchmarks/bench_scaling.py --check writes it from the committed runs
SHIPPED = Path(__file__).with_name("scaling-fits.json")

# (training.strategy, the codec's kind, training.local_steps or None) -> the ladder's row:
# the settings the ladder ran (docs/scaling.md); anything else has no row
ROWS = {("ddp", "int8", None): "ddp-int8", ("diloco", "none", 10): "diloco-h10", ("diloco", "none", 50): "diloco-h50",
        ("oresearcher", "none", None): "cooperative"}


# the published direction of a row's gap to data parallel with model size, where there is one:
# Charles et al. 2025 (arXiv 2503.09799), abstract: "DiLoCo scales better than data-parallel
# training with model size" (35M to 2.4B parameters; tests/data/diloco_published.csv)
PUBLISHED = {"diloco-h10": ("2503.09799, 35M-2.4B", 1), "diloco-h50": ("2503.09799, 35M-2.4B", 1)}


def direction_line(row: str, slope: float) -> str | None:
    """One line: the published direction of ``row``'s multiplier with N beside the ladder's."""
    pub = PUBLISHED.get(row)
    if pub is None:
        return None
    say = {1: "rises", -1: "falls"}
    return f"published ({pub[0]}): m {say[pub[1]]} with N; the ladder's {say[1 if slope > 0 else -1]}"


def row_for(strategy: str, kind: str, local_steps: int) -> str | None:
    """The ladder row that measured this strategy with these settings, or None; ``kind`` is
    the codec's: "none", a dense codec's name ("int8"), or "other" (sparse, error feedback)."""
    return ROWS.get((strategy, kind, local_steps)) or ROWS.get((strategy, kind, None))


@dataclass(frozen=True)
class Trend:
    """ln m = a + b ln N over ``sizes`` measured sizes; ``s`` the residual standard deviation."""

    a: float
    b: float
    s: float
    n: int
    mean_x: float
    sxx: float
    largest: float

    @classmethod
    def fit(cls, sizes, multipliers) -> "Trend":
        xs, ys = [math.log(v) for v in sizes], [math.log(v) for v in multipliers]
        n = len(xs)
        if n < 3:
            raise ValueError("a trend with a band needs 3 sizes or more")
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        a = my - b * mx
        s = math.sqrt(sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / (n - 2))
        return cls(a, b, s, n, mx, sxx, max(sizes))

    def predict(self, size: float) -> tuple[float, float, float]:
        """(m, low, high) at ``size``: the trend and its 95% prediction interval (module doc)."""
        from scipy.stats import t

        x = math.log(size)
        half = t.ppf(0.975, self.n - 2) * self.s * math.sqrt(1 + 1 / self.n + (x - self.mean_x) ** 2 / self.sxx)
        mid = self.a + self.b * x
        return math.exp(mid), math.exp(mid - half), math.exp(mid + half)


def trends(fits: dict) -> dict[str, Trend]:
    """Every strategy row of a fits file (``multipliers``) with 3 or more finite m."""
    out = {}
    for row, points in (fits.get("multipliers") or {}).items():
        pts = [(p["n"], p["m"]) for p in points if "m" in p and p["m"] and math.isfinite(p["m"]) and p["m"] > 0]
        if row != "ddp" and len(pts) >= 3:
            out[row] = Trend.fit(*zip(*pts))
    return out
