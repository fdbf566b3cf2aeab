"""Dense codecs (none, fp16, bf16, int8) against float64 references and their bounds."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from codec_ref import CAST, arrays32, examples, cast_bound, cast_ref, int8_bound, int8_ref, t32
from oresearcher.codecs import build, pack

SETTINGS = examples(60)
ALL_SPECS = ["none", "fp16", "bf16", "int8", "int8:stochastic", "topk:0.1", "topk:0.1:approx", "randk:0.1",
             "topk:0.1+int8", "ef(int8)", "ef(topk:0.1)", "ef21(topk:0.1+int8)", "ef(randk:0.2+fp16)"]


@SETTINGS
@given(x=arrays32(), chunk=st.sampled_from([1, 7, 64, 2048]))
def test_int8_matches_float64_reference(x, chunk):
    c = build(f"int8:chunk={chunk}")
    p = c.encode(t32(x))
    absmax, step, codes, _ = int8_ref(x, chunk)
    # The wire absmax is the exact chunk maximum.
    assert np.array_equal(p.tensors["absmax"].numpy().astype(np.float64), absmax[::chunk])
    # Codes agree with the reference except at near-ties (x/s within 2**-14 of k+1/2).
    got = p.tensors["codes"].numpy().astype(np.float64)
    y = np.divide(x.astype(np.float64), step, out=np.zeros(x.size), where=step > 0)
    near_tie = np.abs(np.abs(y - np.floor(y)) - 0.5) < 2.0**-14
    assert np.all((got == codes) | (near_tie & (np.abs(got - codes) == 1)))


@SETTINGS
@given(x=arrays32(), chunk=st.sampled_from([1, 5, 64, 2048]), stochastic=st.booleans())
def test_int8_error_bound_and_zero(x, chunk, stochastic):
    c = build(f"int8{':stochastic' if stochastic else ''}:chunk={chunk}", seed=3)
    dec = c.decode(c.encode(t32(x))).numpy().astype(np.float64)
    err = np.abs(dec - x.astype(np.float64))
    assert np.all(err <= int8_bound(x, chunk, stochastic))
    assert np.all(dec[x == 0] == 0)  # zero maps to exactly zero


@SETTINGS
@given(x=arrays32(min_size=1), chunk=st.sampled_from([3, 64, 2048]))
def test_int8_stochastic_codes_are_floor_or_ceil(x, chunk):
    c = build(f"int8:stochastic:chunk={chunk}", seed=11)
    got = c.encode(t32(x)).tensors["codes"].numpy().astype(np.float64)
    _, step, _, _ = int8_ref(x, chunk)
    y = np.divide(x.astype(np.float64), step, out=np.zeros(x.size), where=step > 0)
    assert np.all((got >= np.floor(y - 2.0**-15)) & (got <= np.ceil(y + 2.0**-15)))


def test_int8_stochastic_is_unbiased():
    """Mean of M independent draws vs x: |mean - x| <= 5 standard errors, where the
    per-draw variance of stochastic rounding is at most s**2/4."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, generator=g) * torch.logspace(-3, 2, 64)
    x[0], x[1] = 0.0, x[2:].abs().max() * 1.5  # a zero and a chunk maximum
    M = 4000
    c = build("int8:stochastic:chunk=64", seed=1)
    dec = c.decode(c.encode(x.repeat(M))).double().view(M, 64)
    s = x.abs().max().double() / 127
    tol = 5 * s / (2 * M**0.5) + 1e-12
    assert torch.all((dec.mean(0) - x.double()).abs() <= tol)
    # and it is not round-to-nearest in disguise: some elements round both ways
    assert (dec.std(0) > 0).sum() > 40


@pytest.mark.parametrize("spec", ["int8:stochastic", "topk:0.05:approx", "randk:0.05", "ef(int8:stochastic)"])
def test_same_seed_same_bytes(spec):
    xs = [torch.randn(5000, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    a, b, other = build(spec, seed=7, shared_seed=1), build(spec, seed=7, shared_seed=1), build(spec, seed=8, shared_seed=2)
    pa = [pack(a.encode(x)) for x in xs]
    assert all(torch.equal(u, pack(b.encode(x))) for u, x in zip(pa, xs))
    if spec != "topk:0.05:approx":  # a different seed changes the bytes (approx top-k is exact here)
        assert not all(torch.equal(u, pack(other.encode(x))) for u, x in zip(pa, xs))


@SETTINGS
@given(x=arrays32(), spec=st.sampled_from(["fp16", "bf16"]))
def test_casts_match_reference_and_bound(x, spec):
    c = build(spec)
    p = c.encode(t32(x))
    shift, ref = cast_ref(x, spec)
    assert int(p.tensors["shift"][0]) == shift
    dec = c.decode(p).numpy()
    assert np.all(np.isfinite(dec))
    if spec == "fp16" or shift >= 0:
        assert np.array_equal(dec, ref)
    assert np.all(np.abs(dec.astype(np.float64) - x) <= cast_bound(x, spec, shift))


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_casts_do_not_overflow(spec):
    big = np.float32(np.finfo(np.float32).max)
    for x in (np.array([1e6, -7e4, 3.0, 1e-8], np.float32), np.array([big, -big, 1.0], np.float32)):
        p = build(spec).encode(t32(x))
        dec = build(spec).decode(p).numpy()
        assert np.all(np.isfinite(dec))
        err = np.abs(dec.astype(np.float64) - x)
        assert np.all(err <= cast_bound(x, spec, int(p.tensors["shift"][0])))
        large = np.abs(x) >= np.abs(x).max() / 1024  # within 10 binades of the max: relative error
        assert np.all(err[large] <= CAST[spec][2] * np.abs(x[large].astype(np.float64)))


@SETTINGS
@given(x=arrays32())
def test_none_is_exact(x):
    c = build("none")
    dec = c.decode(c.encode(t32(x)))
    assert torch.equal(dec.view(torch.int32), t32(x).view(torch.int32))


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 0, 2), (4, 33)])
def test_round_trip_keeps_shape_dtype_device(spec, dtype, shape):
    x = torch.randn(shape).to(dtype)
    c = build(spec)
    y = c.decode(c.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_raises_and_keeps_state(spec, bad):
    c = build(spec)
    c.encode(torch.randn(100))
    before = c.state_dict()
    x = torch.randn(100)
    x[37] = bad
    with pytest.raises(ValueError, match="non-finite"):
        c.encode(x)
    after = c.state_dict()
    assert repr(_flatten(before)) == repr(_flatten(after))


def _flatten(sd, prefix=""):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(_flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = v.tolist() if isinstance(v, torch.Tensor) else v
    return out


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "int8", "int8:stochastic", "topk:0.5", "topk:0.5+int8"])
@pytest.mark.parametrize("x", [torch.tensor([]), torch.tensor([-3.5]), torch.full((5000,), 0.3), torch.zeros(77)])
def test_empty_single_constant_round_trip(spec, x):
    c = build(spec, seed=2)
    dec = c.decode(c.encode(x))
    assert dec.shape == x.shape
    if x.numel() and not spec.startswith("topk"):
        # a constant chunk sits on the int8 grid (+-127 steps) and on every cast grid;
        # stochastic rounding may take one step down (x*127/a can round to 126.99999)
        assert torch.allclose(dec, x, rtol=1 / 120 if "stochastic" in spec else 2**-8, atol=0)
    if spec.startswith("topk") and x.numel():
        kept = dec != 0
        assert torch.equal(dec[kept], x[kept]) if spec == "topk:0.5" else torch.allclose(dec[kept], x[kept], rtol=1e-2)


@pytest.mark.parametrize("spec", ["int8:chunk=16", "int8:stochastic:chunk=16", "int8:chunk=5", "fp16", "bf16",
                                  "topk:0.05:approx", "ef(int8:chunk=7)"])
@pytest.mark.parametrize("block", [1, 48, 64, 100])
def test_blocking_does_not_change_the_bytes(spec, block, monkeypatch):
    """The CPU paths work in cache-sized blocks; tiny blocks (partial last blocks, tails
    that are not whole chunks) must give the same bytes and decodes as one block."""
    from oresearcher.codecs import quant, sparse
    x = torch.randn(1037, generator=torch.Generator().manual_seed(block)) * 10
    x[100:140] = 0.0
    x[200], x[201:205] = 1e-40, 0.0  # with chunk=5: a chunk whose 127/absmax overflows

    def run():
        c = build(spec, seed=4)
        ps = [c.encode(x * (1 + t), key="k") for t in range(2)]
        return [pack(p) for p in ps], [c.decode(p) for p in ps]

    bytes_one, dec_one = run()
    monkeypatch.setattr(quant, "_BLOCK_ELEMS", block)
    monkeypatch.setattr(sparse, "_BLOCK", block)
    bytes_many, dec_many = run()
    assert all(torch.equal(a, b) for a, b in zip(bytes_one, bytes_many))
    assert all(torch.equal(a, b) for a, b in zip(dec_one, dec_many))
