"""The compiled int8 kernel gives the same bits as the eager torch path (its reference)."""
import math
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from codec_ref import arrays32, examples, finite32, t32
from oresearcher.codecs import build, native
from oresearcher.codecs.quant import dequantize_int8, quantize_int8

needs_kernel = pytest.mark.skipif(native.lib() is None, reason=f"int8 kernel not loaded: {native.how}")
# Values a chunk scale can be made of: subnormals (127/a overflows), the top of the range
# (a/127 rounds up), signed zeros, and ordinary numbers.
special32 = st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 2.0**-128, 3e-39, 3.4e38, -3.4028235e38, 1.0, -0.5])
mixed32 = st.one_of(finite32, special32)


def _both(x: torch.Tensor, chunk: int):
    fast = quantize_int8(x, chunk)
    slow = quantize_int8(x, chunk, use_native=False)
    return fast, slow


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_kernel_builds_where_a_compiler_is():
    assert native.lib() is not None, native.how
    assert native.how.startswith("native C kernel")


@needs_kernel
@examples(150)
@given(x=arrays32(max_size=700, elements=mixed32), chunk=st.sampled_from([1, 3, 64, 256, 2048]))
def test_kernel_equals_eager_path(x, chunk):
    (fa, fq), (sa, sq) = _both(t32(x), chunk)
    assert torch.equal(fa, sa) and torch.equal(fq, sq)
    fd, sd = dequantize_int8(fa, fq, chunk, torch.float32), dequantize_int8(sa, sq, chunk, torch.float32, use_native=False)
    assert torch.equal(fd, sd)
    assert torch.isfinite(fd).all()


@needs_kernel
def test_kernel_equals_eager_path_on_a_large_gradient():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3 * 2048 * 64 + 17, generator=g) * torch.logspace(-6, 3, 3 * 2048 * 64 + 17)
    (fa, fq), (sa, sq) = _both(x, 2048)
    assert torch.equal(fa, sa) and torch.equal(fq, sq)
    assert torch.equal(dequantize_int8(fa, fq, 2048, torch.float32),
                      dequantize_int8(sa, sq, 2048, torch.float32, use_native=False))


@needs_kernel
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", [0, 2047, 2048, 4999])
def test_kernel_rejects_non_finite_anywhere(bad, where):
    x = torch.randn(5000)
    x[where] = bad
    with pytest.raises(ValueError, match="non-finite"):
        native.int8_quantize(x, 2048)
    with pytest.raises(ValueError, match="non-finite"):
        build("int8").encode(x)


def test_kernel_skips_what_it_does_not_cover():
    x = torch.randn(4096)
    assert native.int8_quantize(x.double(), 2048) is None  # float64: eager
    assert native.int8_quantize(x[::2], 2048) is None  # strided: eager
    a, q = quantize_int8(x, 2048, use_native=False)
    assert native.int8_dequantize(a, q, 2048, torch.float64) is None
    # int8 of a strided view still round-trips through the codec (encode flattens).
    c = build("int8")
    y = x.view(64, 64).t()
    assert torch.allclose(c.decode(c.encode(y)), y, atol=float(x.abs().max()) / 127)


def test_disabled_kernel_falls_back(monkeypatch):
    monkeypatch.setenv("ORESEARCHER_NATIVE", "0")
    monkeypatch.setattr(native, "how", native.how)
    native.lib.cache_clear()
    try:
        assert native.lib() is None and "ORESEARCHER_NATIVE=0" in native.how
        x = torch.randn(3000)
        c = build("int8")
        p = c.encode(x)
        assert torch.equal(p.tensors["codes"], quantize_int8(x, 2048, use_native=False)[1])
    finally:
        native.lib.cache_clear()  # the next caller loads the kernel again


@needs_kernel
def test_kernel_equals_eager_path_at_rounding_ties():
    """Inputs a few ulps either side of every tie ``(k + 1/2) * a/127`` of chunks with
    assorted scales ``a``: any other order of float32 operations in the kernel (say
    ``(1/a)*127`` for ``127/a``) rounds some of them the other way."""
    rng = np.random.default_rng(0)
    chunks = []
    for a in np.float32(10.0) ** rng.uniform(-30, 30, 40).astype(np.float32):
        ties = ((np.arange(127) + 0.5) * (float(a) / 127)).astype(np.float32)
        near, up, down = [ties], ties, ties
        for _ in range(6):  # 6 ulps either side
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            near += [up, down]
        body = np.concatenate(near)
        body = np.concatenate([body, -body])[:2047]
        chunks.append(np.concatenate([[a], body]).astype(np.float32))
    x = t32(np.concatenate(chunks))
    (fa, fq), (sa, sq) = _both(x, 2048)
    assert torch.equal(fa, sa) and torch.equal(fq, sq)
