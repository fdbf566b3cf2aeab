"""Sampling a prioritized batch: the sum-tree pool against ``np.random.choice(p=...)``.

    OMP_NUM_THREADS=1 python benchmarks/bench_replay.py
    OMP_NUM_THREADS=1 python benchmarks/bench_replay.py --pool 100000 --batch 64

A pool of 1,000,000 CartPole-sized transitions with random priorities; a batch of 256.
``PrioritizedReplay.sample`` (the whole call: stratified descent, probabilities,
importance weights, gathering the rows) against numpy's weighted choice of 256 indices
from the same priorities (normalised once, outside the timing; numpy still checks and
scans all of them every call), in the same run. Median of repeated calls; the target is a ratio of at least 50.
Also: a priority update of 256 slots, and a sharing round's insert of 256 rows.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from oresearcher.replay import PrioritizedReplay


def median_us(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=1_000_000, help="entries in the pool (default 1,000,000)")
    ap.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    ap.add_argument("--repeats", type=int, default=200, help="timed calls per case (default 200)")
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

    ours = median_us(lambda: pool.sample(k, g, step=10), args.repeats)
    ref = median_us(numpy_choice, max(20, args.repeats // 10))
    slots = rng.integers(0, n, k)
    upd = median_us(lambda: pool.update_priorities(slots, rng.exponential(1.0, k)), args.repeats)
    batch = {c: v[:k] for c, v in rows.items()}
    ins = median_us(lambda: pool.add(batch), args.repeats)
    print(f"pool {n:,} entries (filled in {fill_s:.2f} s), batch {k}")
    print(f"{'case':<44}{'median us':>12}")
    print(f"{'PrioritizedReplay.sample (rows + weights)':<44}{ours:>12,.1f}")
    print(f"{'np.random.choice(n, k, p=p)':<44}{ref:>12,.1f}")
    print(f"{'update_priorities (k slots)':<44}{upd:>12,.1f}")
    print(f"{'add (k rows, FIFO eviction)':<44}{ins:>12,.1f}")
    print(f"ratio np.random.choice / sample: {ref / ours:.1f}x (target >= 50x)")


if __name__ == "__main__":
    main()
