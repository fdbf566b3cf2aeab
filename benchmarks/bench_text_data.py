"""The text task's data: time to prepare each corpus (cold, in a fresh cache, then warm), its
size per split in bytes and tokens, and how fast the batch loader serves tokens against
how fast the smallest text model trains on them.

    OMP_NUM_THREADS=1 python benchmarks/bench_text_data.py              # vocabulary 1024
    OMP_NUM_THREADS=1 python benchmarks/bench_text_data.py --vocab 4096 --batch 16 --seq 256

The cold preparation trains the tokenizer (on the State of the Union training addresses)
and encodes both corpora into a temporary cache, which is removed at the end; the user's
cache is not touched. The loader runs on one thread, as a data-loading core would; the
model trains on the loader's batches with ``--model-threads`` threads (1 by default: on a
shared 2-core machine two threads thrash), and the ratio is also given against 120k
tokens/s, the smallest model's speed on two idle cores (the issue's figure), the stricter
of the two when the machine is busy. The issue asks for a ratio of at least 20.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from oresearcher.tasks.text.corpora import CORPORA, SPLITS
from oresearcher.tasks.text.data import batches, prepare

REFERENCE = 120e3  # tokens/s: text-25k training on two idle cores (the figure)


def prepare_table(vocab: int, root: str) -> list[str]:
    lines = [f"prepare, vocabulary {vocab} (tokenizer trained on sotu's training addresses):"]
    for corpus in CORPORA:
        t0 = time.perf_counter()
        parts = {s: prepare(corpus, s, vocab, cache_dir=root) for s in SPLITS}
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepare(corpus, "train", vocab, cache_dir=root)
        warm = time.perf_counter() - t0
        what = "read, clean, train the tokenizer, encode" if corpus == "sotu" else "read, clean, encode"
        lines.append(f"  {corpus:6s} cold {cold:5.1f} s ({what}), warm {warm * 1e3:4.0f} ms "
                     "(manifest and checksums verified)")
        for s, d in parts.items():
            lines.append(f"    {s:10s} {len(d.documents):4d} documents {d.n_bytes / 1e6:6.2f} MB "
                         f"{len(d.tokens) / 1e6:6.3f} M tokens ({d.n_bytes / len(d.tokens):.2f} "
                         "bytes/token)")
    return lines


def loader_tokens_per_s(data, batch: int, seq: int, seconds: float = 2.0) -> float:
    """Tokens per second the loader serves on one thread (median of 5 timed runs)."""
    it = batches(data, batch, seq, seed=0)
    rates = []
    for _ in range(5):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 5:
            for _ in range(50):
                next(it)
            n += 50
        rates.append(n * batch * seq / (time.perf_counter() - t0))
    return statistics.median(rates)


def model_tokens_per_s(data, model: str, batch: int, seq: int, steps: int = 30):
    """Training tokens per second of ``model`` (forward, backward, AdamW step) on the loader's
    batches; None when the text models are not there."""
    try:
        from oresearcher.tasks.text.model import build_model
    except ImportError:
        return None
    module = build_model(model, data.vocab_size)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    it = batches(data, batch, seq, seed=0)

    def step():
        x = next(it)
        logits = module(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch * seq / (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128, help="tokens per row (the smallest model's context)")
    ap.add_argument("--model", default="text-25k", help="the model whose training speed the loader must beat")
    ap.add_argument("--model-threads", type=int, default=1)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-text-") as root:
        for line in prepare_table(a.vocab, root):
            print(line)
        data = prepare("sotu", "train", a.vocab, cache_dir=root)
        torch.set_num_threads(1)
        served = loader_tokens_per_s(data, a.batch, a.seq)
        torch.set_num_threads(a.model_threads)
        trained = model_tokens_per_s(data, a.model, a.batch, a.seq)
    print(f"loader, {a.batch} x {a.seq} tokens per batch, 1 thread: {served / 1e6:.1f} M tokens/s")
    print(f"  against 120 k tokens/s (the smallest model, 2 idle cores): {served / REFERENCE:.0f}x "
          "(the issue asks for >= 20x)")
    if trained is not None:
        print(f"  {a.model} measured here: {trained / 1e3:.0f} k tokens/s ({a.model_threads} "
              f"thread(s)): {served / trained:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
