"""Time per batch of the synthetic token stream: the per-position loop (the original) vs
the vectorised chain, side by side in one run, median of repeats.

    OMP_NUM_THREADS=1 python benchmarks/bench_data.py                 # gpt-2 vocab, 8 x 2048
    OMP_NUM_THREADS=1 python benchmarks/bench_data.py --vocab 1024 --batch 4 --seq 256

Both draw the same random numbers; only the chain differs (the tests check the tokens
are equal). Runs on one thread, as a data-loading core would.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from oresearcher.tasks.token_stream import TokenStream, chain_batch, draws, power_tables, reference_batch


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    s = TokenStream(a.vocab, a.batch, a.seq, seed=0, rank=0)
    gen = torch.Generator().manual_seed(1)
    tables = power_tables(s.perm, a.seq)
    rows = []
    for _ in range(3):  # interleaved rounds: a noisy neighbour hits both alike
        loop = median_ms(lambda: reference_batch(s.perm, s.noise, a.batch, a.seq, gen), max(3, a.repeats // 3))
        vec = median_ms(lambda: chain_batch(tables, *draws(a.vocab, a.batch, a.seq, s.noise, gen)), a.repeats)
        rows.append((loop, vec))
    loop, vec = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
    draw = median_ms(lambda: draws(a.vocab, a.batch, a.seq, s.noise, gen), a.repeats)
    print(f"token stream, vocab {a.vocab}, {a.batch} x {a.seq} tokens, 1 thread (median ms per batch)")
    print(f"  per-position loop   {loop:8.2f} ms")
    print(f"  vectorised          {vec:8.2f} ms   ({loop / vec:.0f}x; of which the random draws {draw:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
