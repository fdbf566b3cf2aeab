"""The vectorised token stream against the original per-position loop, its resumption,
and the prefetcher's order and checkpoint state."""
import pickle

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher.tasks.token_stream import (Prefetcher, TokenStream, chain_batch, draws, power_tables,
                                            reference_batch)


class LoopStream:
    """The original TokenStream.__next__ (before vectorisation), verbatim: the slow
    obvious reference."""

    def __init__(self, vocab, batch, seq_len, seed, rank, noise=0.1):
        self.vocab, self.batch, self.seq_len, self.noise = vocab, batch, seq_len, noise
        self.perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)

    def __next__(self):
        batch, seq_len, gen = self.batch, self.seq_len, self.gen
        x = torch.empty(batch, seq_len + 1, dtype=torch.long)
        x[:, 0] = torch.randint(self.vocab, (batch,), generator=gen)
        jumps = torch.rand(batch, seq_len, generator=gen) < self.noise
        rand = torch.randint(self.vocab, (batch, seq_len), generator=gen)
        for t in range(seq_len):
            x[:, t + 1] = torch.where(jumps[:, t], rand[:, t], self.perm[x[:, t]])
        return x


def test_same_tokens_as_the_loop_at_gpt2_vocabulary():
    old, new = LoopStream(50257, 8, 2048, seed=3, rank=1), TokenStream(50257, 8, 2048, seed=3, rank=1)
    for _ in range(3):  # consecutive batches: the generator advances identically
        assert torch.equal(next(old), next(new))
    assert torch.equal(old.gen.get_state(), new.gen.get_state())


def test_golden_tokens_unchanged():
    """First tokens for seed 0, rank 0, vocab 50257, printed by the pre-vectorisation code."""
    s = TokenStream(50257, 2, 16, seed=0, rank=0)
    assert next(s)[0, :8].tolist() == [36879, 27346, 16651, 24074, 8976, 26529, 43663, 10218]
    assert next(s)[1, :6].tolist() == [35953, 41441, 38271, 20421, 25355, 36508]


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(1, 300), batch=st.integers(1, 4), seq_len=st.integers(1, 70),
       noise=st.sampled_from([0.0, 0.1, 0.5, 1.0]), seed=st.integers(0, 2**20))
def test_vectorised_chain_equals_reference(vocab, batch, seq_len, noise, seed):
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    g1, g2 = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(seed + 1)
    tables = power_tables(perm, seq_len)
    for _ in range(2):
        assert torch.equal(reference_batch(perm, noise, batch, seq_len, g1),
                           chain_batch(tables, *draws(vocab, batch, seq_len, noise, g2)))


def test_power_tables_compose():
    perm = torch.randperm(97, generator=torch.Generator().manual_seed(0))
    tables = power_tables(perm, 40)
    assert len(tables) == 6  # 2^5 = 32 <= 40 < 64
    x = torch.arange(97)
    for _ in range(32):
        x = perm[x]
    assert torch.equal(tables[5], x)


def test_resumes_exactly():
    a = TokenStream(1000, 2, 64, seed=1, rank=0)
    next(a)
    b = TokenStream(1000, 2, 64, seed=1, rank=0)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    for _ in range(3):
        assert torch.equal(next(a), next(b))


def test_prefetcher_same_batches_and_consumer_state():
    plain = TokenStream(500, 3, 32, seed=2, rank=1)
    pre = Prefetcher(TokenStream(500, 3, 32, seed=2, rank=1), depth=3)
    try:
        for _ in range(4):
            assert torch.equal(next(plain), next(pre))
        # the thread is ahead, but the checkpoint is where the consumer is
        assert torch.equal(pre.state_dict()["generator"], plain.state_dict()["generator"])
        fresh = Prefetcher(TokenStream(500, 3, 32, seed=2, rank=0))  # another rank: another position
        fresh.load_state_dict(pre.state_dict())
        for _ in range(3):
            assert torch.equal(next(fresh), next(plain))
        fresh.close()
    finally:
        pre.close()


def test_prefetcher_reports_a_failing_stream():
    class Broken(TokenStream):
        def next_cpu(self):
            raise ValueError("boom")

    pre = Prefetcher(Broken(10, 1, 4, seed=0, rank=0))
    with pytest.raises(RuntimeError, match="prefetch"):
        next(pre)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetcher_on_cuda_matches_cpu():
    cpu = TokenStream(50257, 8, 2048, seed=0, rank=0)
    gpu = Prefetcher(TokenStream(50257, 8, 2048, seed=0, rank=0, device="cuda"))
    try:
        for _ in range(3):
            x = next(gpu)
            assert x.is_cuda and torch.equal(x.cpu(), next(cpu))
    finally:
        gpu.close()
