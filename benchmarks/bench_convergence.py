"""Held-out check of the convergence prediction: steps to a target loss, predicted from a
small proxy, against runs of a model 6.5x larger.

    OMP_NUM_THREADS=1 python benchmarks/bench_convergence.py
    OMP_NUM_THREADS=1 python benchmarks/bench_convergence.py --cache runs/.convergence-cache --seeds 3
    OMP_NUM_THREADS=1 python benchmarks/bench_convergence.py --ablate   # + the cooperative program, one part off
    OMP_NUM_THREADS=1 python benchmarks/bench_convergence.py --sizes    # + each multiplier at three model sizes

What is compared, for synchronous data parallel, DiLoCo at two H and the cooperative
program (4 agents, 2 explorers, an optimizer and a validator, otherwise
scenarios/8xA100.yaml; numeric mode, synthetic-lm):

- measured: the held-out model (gpt-tiny, 0.86M parameters) trained with the strategy;
  the first step its smoothed mean training loss reaches the target; median over seeds.
- predicted: the base curve is a user's fit of the law's data term, L(D) = c + B / D^beta
  (oresearcher.models.convergence.fit_data_term), to one data-parallel run of the held-out model
  with a seed none of the measured runs use; the strategy's effective-token multiplier
  is the one the simulator measures on its proxy (gpt-proxy, 0.13M parameters). The
  predicted steps are the fit's tokens to the target divided by the multiplier.
- predicted from the fit run's own steps to the target divided by the proxy's
  multiplier (run / m): the multiplier's transfer alone, without the parametric form's
  error. The fit run's seed is none of the measured seeds, so data parallel's row
  checks the seed-to-seed spread, not the run against itself.

The target is fixed by a rule before anything is measured: three quarters of the way down
the fit run's smoothed drop (a target on the plateau near the stream's entropy would be
decided by noise). Data parallel's row checks the fit across seeds; the other rows
check that a multiplier measured at 0.13M parameters carries to 0.86M. The table is
printed as it comes out, within 15% or not. Every run is cached (sim/convergence.py), so a
rerun prints the table at once.
"""
from __future__ import annotations

import argparse
import math
import sys
from statistics import median

from oresearcher.models import convergence as cv
from oresearcher.scenario import load_scenario
from oresearcher.sim import convergence as sc

STRATEGIES = [("ddp", "ddp", []), ("diloco H=10", "diloco", ["training.local_steps=10"]),
              ("diloco H=50", "diloco", ["training.local_steps=50"]), ("oresearcher", "oresearcher", [])]
# --ablate: the cooperative program with one part off at a time, to see which part's gain
# the proxy measures but the held-out model does not get
ABLATIONS = [("coop lr 1x", "oresearcher", ["cooperation.roles.lr_range=[1,1]"]),
             ("coop plain", "oresearcher", ["cooperation.roles.policy=plain"]),
             ("coop average", "oresearcher", ["cooperation.fusion.method=average"]),
             ("coop static", "oresearcher", ["cooperation.roles.policy=static"]),
             ("coop expl 1x", "oresearcher", ["cooperation.roles.explorer_lr_scale=1"]),
             ("coop no noise", "oresearcher", ["cooperation.roles.explorer_noise=0"]),
             ("coop swa", "oresearcher", ["cooperation.roles.optimizer_method=swa"])]
HELD_OUT, FIT_SEED = "gpt-tiny", 100
SIZES = ("gpt-nano", "gpt-proxy", HELD_OUT)  # --sizes: the proxy's smaller neighbour, the proxy, the held-out model


def scenario(strategy, extra, args, model):
    return load_scenario("scenarios/8xA100.yaml", [
        f"training.strategy={strategy}", f"training.lr={args.lr}", f"communication.interval={args.interval}",
        f"convergence.proxy_steps={args.steps}", f"convergence.proxy_seeds={args.seeds}",
        f"convergence.cache_dir={args.cache}", f"convergence.proxy_model={model}", f"agents.count={args.agents}",
        f"agents.roles={{explorer: {args.agents // 2}, optimizer: {args.agents - args.agents // 2 - 1}, "
        "validator: 1}", *extra])


def curve(s, seed, log, **kw):
    spec = s.convergence
    return cv.smooth(sc.run_proxy(s, sc.proxy_data(s, seed, **kw), log), max(5, spec.proxy_steps // 30))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--cache", default="runs/.convergence-cache")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=3e-4, help="learning rate (default: scenarios/8xA100.yaml's)")
    p.add_argument("--interval", type=int, default=50)
    p.add_argument("--agents", type=int, default=4, help="agents (roles: half explorers, one validator)")
    p.add_argument("--levels", action="store_true",
                   help="also print, for each strategy and both models, data parallel's steps over the strategy's at "
                        "each loss level the multiplier takes its median over (first seed), by the fraction of data "
                        "parallel's drop")
    p.add_argument("--ablate", action="store_true",
                   help="also the cooperative program with one part off at a time: every agent at the base "
                        "learning rate (lr_range [1, 1]; explorers keep their scale), no roles (policy plain), "
                        "plain averaging in place of attention fusion, roles kept from the start (static), "
                        "explorers at the base rate, explorers without parameter noise, SWA in place of SAM")
    p.add_argument("--sizes", action="store_true",
                   help="also each strategy's multiplier at three model sizes (gpt-nano, gpt-proxy, the held-out "
                        "gpt-tiny), and the held-out steps a trend in ln N through the two smaller ones would predict")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.steps < 20 or args.agents < 3 or args.interval < 1 or not args.lr > 0:
        p.error("--seeds and --interval at least 1, --steps at least 20, --agents at least 3 (explorers, an "
                "optimizer and a validator), --lr above 0")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731

    ddp_big = scenario("ddp", [], args, HELD_OUT)
    fit_run = curve(ddp_big, FIT_SEED, log, strategy="ddp", codec="none")
    tps = ddp_big.convergence.proxy_seq_len * ddp_big.convergence.proxy_batch * ddp_big.agents.count
    lo = max(1, args.steps // 10)  # past the first steps, where every run falls alike from log V
    c, b, beta = cv.fit_data_term([s * tps for s in range(lo, args.steps + 1)], fit_run[lo - 1:])
    law = cv.ScalingLaw(c, 0.0, b, 1.0, beta, "fit to one held-out data-parallel run")
    target = drop_level(fit_run, 0.75)  # three quarters of the fit run's drop
    print(f"held-out {HELD_OUT} ({sc.n_params(HELD_OUT):,} params) vs proxy gpt-proxy "
          f"({sc.n_params('gpt-proxy'):,}); {args.agents} agents, lr {args.lr:g}, interval {args.interval}, "
          f"{args.steps} steps, {tps} tokens/step")
    print(f"fit (seed {FIT_SEED}): L(D) = {c:.3f} + {b:.3g} / D^{beta:.3f}; target loss {target:.3f} "
          f"(three quarters of the fit run's drop, {fit_run[0]:.3f} -> {fit_run[-1]:.3f})")
    own_fit = math.ceil(cv.tokens_to_loss(law, 1.0, target) / tps)
    own_run = cv.first_at_or_below(fit_run, target)
    print(f"the fit on its own run: {own_fit} steps to the target, the run itself {own_run} "
          f"({own_fit / own_run - 1:+.1%}): the form's error, before any multiplier")
    proxy_m, measured_mid = {}, {}
    print(f"{'strategy':<14}{'proxy m':>17}{'held-out m':>11}{'measured':>9}  {'seeds':<16}{'law fit':>8}"
          f"{'error':>8}{'run / m':>8}{'error':>8}")
    for label, strategy, extra in STRATEGIES + (ABLATIONS if args.ablate else []):
        small, big = scenario(strategy, extra, args, "gpt-proxy"), scenario(strategy, extra, args, HELD_OUT)
        eff = sc.efficiency(small, log) if strategy != "ddp" else cv.Efficiency.of([1.0])
        proxy_m[label] = eff
        seeds = [big.seed + k for k in range(args.seeds)]
        mine = [curve(big, s, log) for s in seeds]
        measured = [cv.first_at_or_below(m, target) for m in mine]
        own = [cv.multiplier(curve(big, s, log, strategy="ddp", codec="none"), m) for s, m in zip(seeds, mine)]
        by_fit = math.ceil(cv.tokens_to_loss(law, 1.0, target, eff.multiplier) / tps)
        reached = [m for m in measured if m is not None]
        mid = median(m if m is not None else math.inf for m in measured)
        by_run = math.ceil(own_run / eff.multiplier) if own_run else None
        measured_mid[label] = mid
        shown = "[" + ", ".join(str(m) if m else "-" for m in measured) + "]"
        if len(reached) * 2 <= len(measured):
            cells = (f"not reached {len(measured) - len(reached)}/{len(measured)}", "", "")
        else:
            cells = (f"{mid:g}", f"{by_fit / mid - 1:+.1%}", "" if by_run is None else f"{by_run / mid - 1:+.1%}")
        own_txt = f"{median(x for x in own if x):.2f}" if any(own) else "-"
        print(f"{label:<14}{eff.multiplier:>7.2f} [{eff.low:.2f}-{eff.high:.2f}]{own_txt:>11}{cells[0]:>9}  "
              f"{shown:<16}{by_fit:>8}{cells[1]:>8}{by_run or '-':>8}{cells[2]:>8}")
    print("m: effective-token multiplier against data parallel, median over seeds [range]; measured: median over "
          "seeds of the first step at the target (seeds: each one's); law fit: the fit's steps / proxy m; "
          f"run / m: the fit run's own steps ({own_run}) / proxy m (the multiplier alone, without the form's error); "
          "error: predicted / measured - 1")
    if args.levels:
        by_level(args, log)
    if args.sizes:
        by_size(args, own_run, lambda m: math.ceil(cv.tokens_to_loss(law, 1.0, target, m) / tps), measured_mid, log)
    published(proxy_m)
    return 0


def by_level(args, log) -> None:
    """Each strategy's step ratio at each shared loss level, on the proxy and the held-out
    model (their first seed): where along the drop a multiplier comes from."""
    print("step ratio (data parallel / strategy) by fraction of data parallel's drop, first seed:")
    for label, strategy, extra in STRATEGIES[1:]:
        for model in ("gpt-proxy", HELD_OUT):
            s = scenario(strategy, extra, args, model)
            base, mine = curve(s, s.seed, log, strategy="ddp", codec="none"), curve(s, s.seed, log)
            cells = [f"{(base[0] - level) / (base[0] - base[-1]):.2f}:{ratio:.2f}"
                     for level, ratio in cv.level_ratios(base, mine)]
            print(f"  {label:<12} {model:<10} {' '.join(cells)}")


def by_size(args, own_run, law_steps, measured: dict, log) -> None:
    """Each strategy's multiplier on three model sizes, seed by seed against data parallel
    on the same size and seed: does the gain shrink or grow with N, and would a straight
    line in (ln N, ln m) through the two smaller sizes carry the proxy's multiplier to the
    held-out model?"""
    n = [sc.n_params(model) for model in SIZES]
    print("efficiency by model size (median over seeds; m: over loss levels, as the simulator measures it; at 3/4: "
          "data parallel's steps over the strategy's to three quarters of each seed's data-parallel drop):")
    print(f"{'strategy':<14}" + "".join(f"{f'{model} ({k / 1e6:.2f}M)':>24}" for model, k in zip(SIZES, n))
          + f"{'trend m':>9}{'law fit':>8}{'error':>8}{'run / m':>8}{'error':>8}")
    bases = {}  # model -> data parallel's curve per seed, shared by every strategy's row
    for model in SIZES:
        s = scenario("ddp", [], args, model)
        bases[model] = [curve(s, s.seed + k, log, strategy="ddp", codec="none") for k in range(args.seeds)]
    size_ms = {}  # label -> m at each size
    for label, strategy, extra in STRATEGIES[1:]:
        cells, ms = [], []
        for model, base in bases.items():
            s = scenario(strategy, extra, args, model)
            mine = [curve(s, s.seed + k, log) for k in range(args.seeds)]
            m = median(x for x in (cv.multiplier(b, y) for b, y in zip(base, mine)) if x)
            at = median(ratio_at(b, y, 0.75) for b, y in zip(base, mine))
            ms.append(m)
            cells.append(f"m {m:.2f}, at 3/4 {at:.2f}")
        slope = math.log(ms[1] / ms[0]) / math.log(n[1] / n[0])
        trend = ms[1] * (n[2] / n[1]) ** slope
        by_fit, by_run, mid = law_steps(trend), math.ceil(own_run / trend), measured.get(label)
        errors = [f"{x / mid - 1:+.1%}" if mid and math.isfinite(mid) else "-" for x in (by_fit, by_run)]
        print(f"{label:<14}" + "".join(f"{c:>24}" for c in cells)
              + f"{trend:>9.2f}{by_fit:>8}{errors[0]:>8}{by_run:>8}{errors[1]:>8}")
        size_ms[label] = ms
    print(f"trend m: the line in (ln N, ln m) through {SIZES[0]} and {SIZES[1]}, read at {SIZES[2]}; law fit and "
          f"run / m as above with trend m in place of the proxy's; error: against the measured median above")
    h10, h50 = size_ms["diloco H=10"], size_ms["diloco H=50"]
    print(f"published (2503.09799, 35M-2.4B parameters): DiLoCo scales better than data parallel with model size; "
          f"here its m {'falls' if h10[2] < h10[0] and h50[2] < h50[0] else 'does not fall'} with N "
          f"(H=10 {h10[0]:.2f} -> {h10[2]:.2f}, H=50 {h50[0]:.2f} -> {h50[2]:.2f})")


def drop_level(curve, fraction: float) -> float:
    """The loss ``fraction`` of the way down ``curve``'s drop, first value to last."""
    return curve[0] - fraction * (curve[0] - curve[-1])


def ratio_at(base, other, fraction: float) -> float:
    """Data parallel's steps over the strategy's to ``fraction`` of data parallel's drop
    (nan where either curve does not get there)."""
    r = cv.step_ratio(base, other, drop_level(base, fraction))
    return math.nan if r is None else r


def published(proxy_m: dict) -> None:
    """The proxy's DiLoCo multipliers beside what the DiLoCo papers state (tests/data)."""
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "tests" / "data" / "diloco_published.csv"
    rows = list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))
    h10, h50 = proxy_m["diloco H=10"], proxy_m["diloco H=50"]
    print("published cross-check (tests/data/diloco_published.csv):")
    for r in rows:
        hi = float(r["m_high"]) if r["m_high"] else math.inf
        inside = [f"{k} {m.multiplier:.2f}: {'inside' if float(r['m_low']) <= m.multiplier <= hi else 'outside'}"
                  for k, m in (("H=10", h10), ("H=50", h50))]
        print(f"  {r['paper']} ({r['workers']} workers, H {r['inner_steps']}): {r['claim']}, "
              f"read as m in [{r['m_low']}, {r['m_high'] or 'inf'}]; proxy {'; '.join(inside)}")
    print(f"  direction: fewer inner steps {'no worse' if h10.multiplier >= h50.multiplier else 'WORSE'} per token "
          f"on the proxy (H=10 {h10.multiplier:.2f} vs H=50 {h50.multiplier:.2f})")


if __name__ == "__main__":
    sys.exit(main())
