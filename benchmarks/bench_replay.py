"""Sampling a prioritized batch: the sum-tree pool against ``np.random.choice(p=...)``.

    OMP_NUM_THREADS=1 python benchmarks/bench_replay.py
    OMP_NUM_THREADS=1 python benchmarks/bench_replay.py --pool 100000 --batch 64

A pool of 1,000,000 CartPole-sized transitions with random priorities; a batch of 256.
``PrioritizedReplay.draw`` (stratified descent, probabilities, importance weights: k
indices and their weights) against numpy's weighted choice of 256 indices from the same
priorities (normalised once, outside the timing; numpy still checks and scans all of
them every call), in the same run; the target is a ratio of at least 50. Beside it
``PrioritizedReplay.sample``, the whole call a learner makes (the draw, then the rows
of every column gathered: random reads numpy's choice does not do). Medians of
repeated calls.
Also: a priority update of 256 slots, and a sharing round's insert of 256 rows.

    OMP_NUM_THREADS=1 python benchmarks/bench_replay.py --cartpole 3   # + CartPole with and without the pool

``--cartpole N`` also trains ``scenarios/cartpole-4.yaml`` (4 DQN agents, 1,200 steps) on
seeds 100..100+N-1 with each agent's own buffer, with the shared pool and Ape-X epsilons
by role, and with the shared pool and the task's decaying epsilon, in the reference
interpreter, and prints the agents' mean test return. ``--digits N`` does the same for
``scenarios/digits-4.yaml`` (200 steps) without and with the shared hard-example pool.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from oresearcher.cooperation.replay import PrioritizedReplay


def median_us(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def compare(scenario: str, metric: str, configs, seeds: int) -> None:
    """Mean final ``metric`` of the agents per config, over seeds 100.. (reference interpreter)."""
    from oresearcher.programs import AgentContext, get_program
    from oresearcher.scenario import load_scenario
    from oresearcher.tasks import make_learner
    from oresearcher.testing import run_programs

    places = 1 if metric == "test_return" else 3
    for label, sets in configs:
        means = []
        for seed in range(100, 100 + seeds):
            sc = load_scenario(scenario, sets + [f"seed={seed}"])
            learners = [make_learner(sc, r, mode="numeric") for r in range(sc.world_size)]
            steps = run_programs([get_program("oresearcher")(AgentContext(r, sc.world_size, sc, mode="numeric"), l)
                                  for r, l in enumerate(learners)])
            means.append(statistics.mean(s[-1].metrics[metric] for s in steps))
        sd = statistics.stdev(means) if len(means) > 1 else 0.0
        print(f"{label:<14}{statistics.mean(means):>8.{places}f} +- {sd:.{places}f}   "
              + " ".join(f"{m:.{places}f}" for m in means), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=1_000_000, help="entries in the pool (default 1,000,000)")
    ap.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    ap.add_argument("--repeats", type=int, default=200, help="timed calls per case (default 200)")
    ap.add_argument("--cartpole", type=int, default=0, metavar="N", help="also train CartPole on N seeds (default 0)")
    ap.add_argument("--digits", type=int, default=0, metavar="N", help="also train digits on N seeds (default 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    n, k = args.pool, args.batch
    rng = np.random.default_rng(0)
    raw = rng.exponential(1.0, n)
    pool = PrioritizedReplay(n, alpha=0.6, beta_steps=1000)
    rows = {"s": torch.randn(n, 4), "a": torch.randint(2, (n,)), "r": torch.ones(n), "s2": torch.randn(n, 4),
            "d": torch.zeros(n), "id": torch.arange(n)}
    t = time.perf_counter()
    pool.add(rows, priorities=raw)
    fill_s = time.perf_counter() - t
    g = torch.Generator().manual_seed(0)
    probs = pool.priorities() / pool.sums.root  # normalised once, outside the timing: numpy's best case

    def numpy_choice():
        np.random.choice(n, k, p=probs)

    drawn = median_us(lambda: pool.draw(k, g, step=10), args.repeats)
    ours = median_us(lambda: pool.sample(k, g, step=10), args.repeats)
    ref = median_us(numpy_choice, max(20, args.repeats // 10))
    slots = rng.integers(0, n, k)
    upd = median_us(lambda: pool.update_priorities(slots, rng.exponential(1.0, k)), args.repeats)
    batch = {c: v[:k] for c, v in rows.items()}
    ins = median_us(lambda: pool.add(batch), args.repeats)
    print(f"pool {n:,} entries (filled in {fill_s:.2f} s), batch {k}")
    print(f"{'case':<44}{'median us':>12}")
    print(f"{'PrioritizedReplay.draw (slots + weights)':<44}{drawn:>12,.1f}")
    print(f"{'PrioritizedReplay.sample (+ the rows)':<44}{ours:>12,.1f}")
    print(f"{'np.random.choice(n, k, p=p)':<44}{ref:>12,.1f}")
    print(f"{'update_priorities (k slots)':<44}{upd:>12,.1f}")
    print(f"{'add (k rows, FIFO eviction)':<44}{ins:>12,.1f}")
    print(f"ratio np.random.choice / draw: {ref / drawn:.1f}x (target >= 50x: both give k indices)")
    print(f"ratio np.random.choice / sample: {ref / ours:.1f}x (sample also gathers the {len(rows)} columns' rows)")
    on = ["cooperation.replay.enabled=true"]
    if args.cartpole:
        print(f"\ncartpole-4, mean test return of the 4 agents (max 500), seeds 100-{99 + args.cartpole}")
        compare("scenarios/cartpole-4.yaml", "test_return", (
            ("own buffers", []), ("shared, Ape-X", on),
            ("shared, decay", on + ["cooperation.replay.apex_epsilon=false"])), args.cartpole)
    if args.digits:
        print(f"\ndigits-4, mean test accuracy of the 4 agents, seeds 100-{99 + args.digits}")
        compare("scenarios/digits-4.yaml", "test_accuracy", (("no pool", []), ("hard examples", on)), args.digits)


if __name__ == "__main__":
    main()
