"""Simulated all-reduce against published nccl-tests curves: a table per reference, one figure.

    python benchmarks/bench_collectives.py            # prints tables, writes runs/bench_collectives.png
    python benchmarks/bench_collectives.py --out DIR

Each shipped reference (tests/data/nccl-*.csv, each naming its source on its first line) is
simulated on the cluster it ran on (oresearcher.sim.bench.REFERENCES) at its own sizes.
The error is exp(mean |ln(simulated / measured)|) - 1 over its sizes (the -g 8 curve from
1 MiB up: below, its host launch floor hides the collective; the H100 curve from 1 MiB up:
it does not say how it was launched).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from oresearcher.reporting.units import format_bytes  # noqa: E402
from oresearcher.sim.bench import REFERENCES, reference_check  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs", help="directory for bench_collectives.png (default runs)")
    args = ap.parse_args(argv)
    fig, axes = plt.subplots(1, len(REFERENCES), figsize=(4.5 * len(REFERENCES), 3.8))
    for ax, name in zip(axes, sorted(REFERENCES)):
        rows, ref, err = reference_check(name, DATA / f"nccl-{name}.csv")
        r = REFERENCES[name]
        nodes, g, inter, launch, lo = r.nodes, r.gpus_per_node, r.inter, r.launch, r.min_size
        print(f"\n{name}: {nodes} x {g} {r.device}, {r.intra}" + (f" + {inter}" if inter else "") + f", {launch}")
        print(f"{'size':>9} {'sim (us)':>10} {'meas (us)':>10} {'ratio':>6}  algorithm")
        for row, (s, t) in zip(rows, ref):
            print(f"{format_bytes(s, binary=True):>9} {row['time_us']:10.1f} {t:10.1f} {row['time_us'] / t:6.2f}  {row['algorithm']}")
        print(f"error: {err:.1%}" + (f" (sizes >= {format_bytes(lo, binary=True)})" if lo else ""))
        ax.loglog([s for s, _ in ref], [t for _, t in ref], "s--", ms=3, label="published")
        ax.loglog([r["size_bytes"] for r in rows], [r["time_us"] for r in rows], "o-", ms=3, label="simulated")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{name[:40]}\n{nodes}x{g} {r.device}, {launch}: error {err:.1%}", fontsize=8)
        ax.set_xlabel("all-reduce size (bytes)")
        ax.set_ylabel("time (us)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from oresearcher.files import save_figure

    save_figure(fig, out / "bench_collectives.png", dpi=110)  # atomic, never through a link
    print(f"\nwrote {out / 'bench_collectives.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
