"""top-k (exact and sampled threshold), rand-k and top-k+int8 against float64 references."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from codec_ref import arrays32, examples, int8_bound, k_ref, t32, topk_ref_magnitudes
from oresearcher.codecs import build
from oresearcher.codecs.base import RngState
from oresearcher.codecs.sparse import threshold_topk_indices

SETTINGS = examples(60)
ratios = st.sampled_from([0.01, 0.1, 0.25, 0.5, 1.0])
# Few distinct magnitudes: plenty of ties.
tied = st.sampled_from([0.0, 1.0, -1.0, 2.0, -2.0, 0.5])


def _check_top_set(x: np.ndarray, dec: np.ndarray, k: int, exact: bool, tol: float = 0.0):
    """The properties every top-k decode promises (float64 checks)."""
    x64 = x.astype(np.float64)
    kept = dec != 0
    nnz_x = int(np.count_nonzero(x))
    if exact:
        assert kept.sum() == min(k, nnz_x)  # exactly k non-zeros when x has k of them
    else:
        assert math.ceil((1 - tol) * k) <= kept.sum() <= k or kept.sum() == nnz_x < k
    # kept values are bit-exact
    assert np.array_equal(dec[kept].view(np.int32), x[kept].view(np.int32))
    # no dropped magnitude exceeds a kept one
    if kept.any() and (~kept).any():
        assert np.abs(x64[~kept]).max() <= np.abs(x64[kept]).min()
    # contraction, with k' = number kept
    kk = kept.sum() if not exact else k
    d = x.size
    if d:
        lhs = np.sum((x64 - dec) ** 2)
        assert lhs <= (1 - kk / d) * np.sum(x64**2) * (1 + 1e-12)


@SETTINGS
@given(x=arrays32() | arrays32(elements=tied), ratio=ratios)
def test_exact_topk_matches_reference(x, ratio):
    c = build(f"topk:{ratio}")
    p = c.encode(t32(x))
    dec = c.decode(p).numpy()
    k = k_ref(ratio, x.size)
    assert p.tensors["idx"].numel() == k and p.tensors["idx"].unique().numel() == k
    _check_top_set(x, dec, k, exact=True)
    # the kept magnitudes are the reference's top-k magnitudes, whatever the tie-breaking
    got = np.sort(np.abs(x[p.tensors["idx"].numpy()]).astype(np.float64))[::-1]
    assert np.array_equal(got, topk_ref_magnitudes(x, k))


@SETTINGS
@given(x=arrays32(min_size=1, max_size=3000) | arrays32(min_size=1, elements=tied), ratio=ratios,
       tol=st.sampled_from([0.0, 0.1, 0.5]), seed=st.integers(0, 2**31))
def test_threshold_topk_keeps_a_top_set(x, ratio, tol, seed):
    c = build(f"topk:{ratio}:approx:tol={tol}" if tol != 0.1 else f"topk:{ratio}:approx", seed=seed)
    p = c.encode(t32(x))
    k = k_ref(ratio, x.size)
    idx = p.tensors["idx"]
    assert idx.numel() == k and idx.unique().numel() == k  # distinct: deterministic scatter
    _check_top_set(x, c.decode(p).numpy(), k, exact=False, tol=tol)


def test_threshold_topk_short_path_is_exercised_and_correct():
    """Heavy-tailed inputs where a sampled threshold sometimes undershoots k: then
    ceil((1-tol)k) <= k' < k elements are kept and the padding slots carry zeros."""
    short = 0
    d, k = 2000, 20
    for seed in range(100):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(d, generator=g) * 1e-3
        x[torch.randperm(d, generator=g)[:k]] = torch.randn(k, generator=g).abs() + 1  # k large ones
        idx, kept = threshold_topk_indices(x, k, RngState(seed).generator("cpu"), tol=0.1)
        assert idx.unique().numel() == k and math.ceil(0.9 * k) <= kept <= k
        big = x[idx[:kept]].abs()
        rest = torch.ones(d, dtype=torch.bool)
        rest[idx[:kept]] = False
        assert x[rest].abs().max() <= big.min()
        short += kept < k
    assert short > 0  # the path with padding ran at least once


@pytest.mark.parametrize("spec", ["topk:0.01", "topk:0.01:approx"])
def test_topk_large_tensor_is_exact_top_k(spec):
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    c = build(spec)
    dec = c.decode(c.encode(x)).numpy()
    _check_top_set(x.numpy(), dec, 2000, exact=True)  # with ~1.25k candidates approx is exact


@SETTINGS
@given(x=arrays32(min_size=1), ratio=ratios, chunk=st.sampled_from([4, 2048]))
def test_topk_int8_quantizes_the_kept_values(x, ratio, chunk):
    c = build(f"topk:{ratio}+int8:chunk={chunk}")
    p = c.encode(t32(x))
    idx = p.tensors["idx"].long().numpy()
    dec = c.decode(p).numpy().astype(np.float64)
    vals = x[idx]
    assert np.all(np.abs(dec[idx] - vals) <= int8_bound(vals, chunk))
    rest = np.ones(x.size, bool)
    rest[idx] = False
    assert np.all(dec[rest] == 0)
    assert np.array_equal(np.sort(np.abs(vals.astype(np.float64)))[::-1], topk_ref_magnitudes(x, idx.size))


def test_randk_is_unbiased():
    """Mean over M draws vs x within 5 standard errors; per draw
    Var = x_i**2 (d/k)(1 - 1/d) for sampling with replacement."""
    d, M = 50, 3000
    x = torch.randn(d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    c = build("randk:0.1", shared_seed=3)
    acc = torch.zeros(d, dtype=torch.float64)
    for _ in range(M):
        acc += c.decode(c.encode(x))
    k = k_ref(0.1, d)
    se = x.abs() * math.sqrt(d / k * (1 - 1 / d) / M)
    assert torch.all((acc / M - x).abs() <= 5 * se)


def test_randk_shared_seed_gives_same_indices_and_self_contained_payloads():
    a, b = build("randk:0.05", shared_seed=9, seed=1), build("randk:0.05", shared_seed=9, seed=2)
    xa, xb = torch.randn(1000), torch.randn(1000)
    pa, pb = a.encode(xa, key="g"), b.encode(xb, key="g")
    assert torch.equal(pa.tensors["seed"], pb.tensors["seed"])
    da, db = a.decode(pa), b.decode(pb)
    assert torch.equal(da != 0, db != 0)  # the same support on both agents
    assert torch.equal(build("randk:0.05").decode(pa), da)  # any receiver can decode
    assert not torch.equal(pa.tensors["seed"], a.encode(xa, key="g").tensors["seed"])  # next draw differs
    assert pa.nbytes == 8 + 4 * 50  # seed + values: no indices on the wire


def test_randk_scaling_and_support():
    x = torch.arange(1.0, 101.0)
    c = build("randk:0.1", shared_seed=0)
    dec = c.decode(c.encode(x))
    support = dec != 0
    # each drawn element decodes to (d/k) * x * (times drawn)
    times = dec[support] / (x[support] * 10)
    assert torch.allclose(times, times.round()) and times.sum() == 10
