"""Codec throughput, bytes on the wire, and the collective trade-off, as ratios.

    OMP_NUM_THREADS=1 python benchmarks/bench_codecs.py            # about a minute
    OMP_NUM_THREADS=1 python benchmarks/bench_codecs.py --quick    # 1M elements only

Every speed is a ratio against a baseline measured in the same run, interleaved with
it (each repeat times the baseline and the codec back to back; medians over repeats):

1. encode+decode of each codec vs a plain tensor copy (``x.clone()``) of the same
   float32 tensor (1M and 25M elements); "x copy" = copy time / codec time, so 0.5 means
   half the speed of a copy. Target: int8 >= 0.5.
2. the sampled-threshold top-k vs ``torch.topk`` at k = 1% of 25M (selection only, and
   the whole encode of ``topk:0.01:approx`` vs ``topk:0.01``). Target: >= 5x.
3. bytes on the wire relative to float32 for each codec (int8: 25% + scale overhead).
4. bytes each rank sends at n = 8 ranks for a 25M-element bucket: plain ring
   all-reduce, all-gather exchange, two-phase compressed all-reduce.
5. (``--accuracy``) test accuracy of a small MLP on sklearn's digits trained data-parallel
   by 4 agents whose averaged gradients go through :func:`two_phase_allreduce` with each
   codec (same seeds, same batches), against the uncompressed run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from oresearcher.codecs import build, collective_wire_bytes_per_rank, two_phase_allreduce
from oresearcher.codecs.base import RngState
from oresearcher.codecs import native
from oresearcher.codecs.quant import dequantize_int8, quantize_int8
from oresearcher.codecs.sparse import k_of, threshold_topk_indices

SPECS = ["none", "fp16", "bf16", "int8", "int8:stochastic", "topk:0.01", "topk:0.01:approx", "randk:0.01",
         "topk:0.01+int8", "ef(int8)", "ef(topk:0.01:approx)", "ef21(topk:0.01:approx+int8)"]
EAGER_INT8 = "int8 [eager torch reference]"


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def paired(base, fn, repeats: int):
    """Median seconds of ``base`` and ``fn``, timed back to back in each repeat."""
    fn()  # warm-up (allocator, first-touch of lazily created generators)
    tb, tf = [], []
    for _ in range(repeats):
        tb.append(_time(base))
        tf.append(_time(fn))
    return statistics.median(tb), statistics.median(tf)


def throughput(sizes, repeats):
    print(f"\n1. encode+decode vs a plain copy (float32; median of {repeats} at 25M, {5 * repeats} at 1M; "
          "x copy = copy time / codec time)")
    print(f"{'codec':32s}" + "".join(f"{f'{n / 1e6:g}M ms':>12s}{'x copy':>8s}" for n in sizes))
    xs = {n: torch.randn(n, generator=torch.Generator().manual_seed(0)) for n in sizes}
    copy_ms = {}
    def eager_int8(x):  # the torch reference path the native kernel replaces
        a, q = quantize_int8(x, 2048, use_native=False)
        return dequantize_int8(a, q, 2048, torch.float32, use_native=False)

    for spec in SPECS + [EAGER_INT8]:
        row = f"{spec:32s}"
        for n in sizes:
            c, x = (None if spec == EAGER_INT8 else build(spec)), xs[n]
            slow = spec.startswith(("topk:0.01", "ef(topk:0.01)")) and ":approx" not in spec
            reps = (max(3, repeats // 3) if slow else repeats) if n > 5e6 else 5 * repeats  # small: cheap, noisy
            run = (lambda: eager_int8(x)) if c is None else (lambda: c.decode(c.encode(x)))
            tb, tf = paired(lambda: x.clone(), run, reps)
            copy_ms[n] = tb * 1e3
            row += f"{tf * 1e3:12.1f}{tb / tf:8.2f}"
        print(row, flush=True)
    print(f"int8 round-to-nearest ran on: {native.how}")
    print("copy of the same tensor, ms: " + ", ".join(f"{n / 1e6:g}M {copy_ms[n]:.1f}" for n in sizes))


def topk_speed(n, repeats):
    k = k_of(0.01, n)
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    gen = RngState(0).generator("cpu")
    print(f"\n2. top-k at k = 1% of {n / 1e6:g}M (median of {repeats})")
    tb, tf = paired(lambda: torch.topk(x.abs(), k, sorted=False), lambda: threshold_topk_indices(x, k, gen, 0.1), repeats)
    print(f"   selection: torch.topk {tb * 1e3:.0f} ms, sampled threshold {tf * 1e3:.0f} ms -> {tb / tf:.1f}x faster")
    exact, approx = build("topk:0.01"), build("topk:0.01:approx")
    tb, tf = paired(lambda: exact.encode(x), lambda: approx.encode(x), repeats)
    print(f"   encode:    topk:0.01 {tb * 1e3:.0f} ms, topk:0.01:approx {tf * 1e3:.0f} ms -> {tb / tf:.1f}x faster")


def wire_table(n):
    print(f"\n3. bytes on the wire relative to float32 ({n / 1e6:g}M elements)")
    for spec in SPECS:
        c = build(spec)
        print(f"   {spec:32s}{c.wire_bytes(n) / (4 * n):10.4%}")
    int8 = build("int8").wire_bytes(n)
    print(f"   int8 scale overhead: {(int8 - n) / n:.4%} of the int8 codes, {(int8 - n) / (4 * n):.4%} of float32")


def tradeoff_table(n, ranks=8):
    plain = collective_wire_bytes_per_rank("allreduce", None, n, ranks)
    print(f"\n4. MB each rank sends, {ranks} ranks, {n / 1e6:g}M float32 elements "
          f"(plain ring all-reduce: {plain / 1e6:.1f} MB = 1.00)")
    print(f"   {'codec':32s}{'allgather MB':>14s}{'ratio':>8s}{'two-phase MB':>14s}{'ratio':>8s}")
    for spec in SPECS:
        c = build(spec)
        ag = collective_wire_bytes_per_rank("allgather", c, n, ranks)
        tp = collective_wire_bytes_per_rank("two_phase", c, n, ranks)
        print(f"   {spec:32s}{ag / 1e6:14.1f}{ag / plain:8.3f}{tp / 1e6:14.1f}{tp / plain:8.3f}")


def _train(spec, n=4, epochs=25, batch=64, lr=0.1, seed=0):
    """Test accuracy (%) of a 64-128-10 MLP trained data-parallel through ``spec``."""
    from sklearn.datasets import load_digits

    from oresearcher.testing import run_programs
    X, y = load_digits(return_X_y=True)
    X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    tr, te = perm[:1400], perm[1400:]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    codecs = [build(spec, seed=r, shared_seed=seed) for r in range(n)]
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(epochs):
        order = tr[torch.randperm(len(tr), generator=g)]
        for b in range(0, len(order) - batch + 1, batch):
            shards = order[b:b + batch].chunk(n)
            grads = []
            for idx in shards:  # each agent's gradient on its shard
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
                grads.append(torch.cat([p.grad.reshape(-1) for p in params]))
            out = [None] * n

            def prog(r):
                out[r] = yield from two_phase_allreduce(codecs[r], grads[r], rank=r, world_size=n, average=True)
            run_programs([prog(r) for r in range(n)])
            off = 0
            for p in params:
                p.grad = out[0][off:off + p.numel()].view_as(p).clone()
                off += p.numel()
            opt.step()
    with torch.no_grad():
        return 100.0 * (model(X[te]).argmax(1) == y[te]).float().mean().item()


def accuracy_table(specs=("none", "int8", "int8:stochastic", "ef(int8)", "topk:0.01", "ef(topk:0.01)",
                          "ef(topk:0.01+int8)"), seeds=(0,)):
    """Accuracy per codec, and its paired difference from "none" (same seed, same batches)."""
    print(f"\n5. digits MLP, 4 agents, gradients via two-phase all-reduce; test accuracy (397 samples), "
          f"seeds {list(seeds)}: mean +- std")
    base = {s: _train("none", seed=s) for s in seeds}
    for spec in specs:
        accs = [base[s] if spec == "none" else _train(spec, seed=s) for s in seeds]
        diffs = [a - base[s] for a, s in zip(accs, seeds)]
        sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        print(f"   {spec:32s}{statistics.mean(accs):8.2f}%{statistics.mean(diffs):+8.2f} +- {sd:.2f} points",
              flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M elements only")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--accuracy", action="store_true", help="also train the digits MLP with each codec (~1 min a seed)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds for --accuracy (paired against 'none')")
    ap.add_argument("--accuracy-only", action="store_true", help="skip the speed and bytes tables")
    args = ap.parse_args(argv)
    if args.accuracy_only:
        accuracy_table(seeds=range(args.seeds))
        return
    sizes = [1_000_000] if args.quick else [1_000_000, 25_000_000]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}")
    throughput(sizes, args.repeats)
    topk_speed(sizes[-1], max(3, args.repeats // 2))
    wire_table(25_000_000)
    tradeoff_table(25_000_000)
    if args.accuracy:
        accuracy_table(seeds=range(args.seeds))


if __name__ == "__main__":
    main()
