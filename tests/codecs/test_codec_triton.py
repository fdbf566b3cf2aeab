"""The Triton codec kernels (oresearcher/codecs/fused.py) against the eager path, bit for bit.

CI has no GPU: the kernels run on CPU tensors in Triton's interpreter. Triton chooses
compile or interpret once per process, when it is first imported, from TRITON_INTERPRET;
without a GPU this module sets it if nothing imported triton yet (else the tests run in a child
process: test_codec_triton_build.py). On a GPU machine run
``TRITON_INTERPRET=1 pytest tests/codecs/test_codec_triton.py`` (the compiled kernels are
checked by test_codec_cuda.py). Skipped where triton is not installed.
"""
import os
import sys
from unittest import mock

import numpy as np
import pytest
import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    # stays set: the interpreter also reads it while kernels run. torch imports triton too
    # (torch.utils.flop_counter -> torch._native), so in a full run it usually comes first
    # and test_codec_triton_build.py runs this module again in a child process.
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
from oresearcher.codecs import fused  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from codec_ref import arrays32, examples, finite32, int8_bound, t32  # noqa: E402
from oresearcher.codecs import build, pack  # noqa: E402
from oresearcher.codecs.quant import dequantize_int8, quantize_int8  # noqa: E402
from oresearcher.codecs.sparse import DEVICE_STREAM, hash_indices, rand_indices  # noqa: E402

pytestmark = pytest.mark.skipif(not fused.interpreted(), reason="triton was imported before TRITON_INTERPRET=1 "
                                "was set: test_codec_triton_build.py runs this module in a child process")
special32 = st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 2.0**-128, 3e-39, 3.4e38, -3.4028235e38, 1.0, -0.5])
mixed32 = st.one_of(finite32, special32)
CHUNKS = st.sampled_from([1, 3, 64, 256, 2048])


def _uniforms(x: torch.Tensor, chunk: int, seed: int) -> torch.Tensor:
    """The uniforms the eager path uses for ``n < 2**19`` elements: one block of full
    chunks, then the tail; then fresh ones for each chunk whose ``127/a`` overflows,
    which it quantizes again in a second pass (quant.quantize_int8's order)."""
    g = torch.Generator().manual_seed(seed)
    n = x.numel()
    full = n - n % chunk
    parts = [torch.rand((full // chunk, chunk), generator=g).view(-1)] if full else []
    if n > full:
        parts.append(torch.rand((1, n - full), generator=g).view(-1))
    u = torch.cat(parts) if parts else torch.empty(0)
    for c in range(0, n, chunk):
        a = x[c:c + chunk].abs().max()
        if a > 0 and torch.isinf(127.0 / a):
            u[c:c + chunk] = torch.rand(u[c:c + chunk].shape, generator=g)
    return u


@pytest.fixture
def on_cpu(monkeypatch):
    """Route the codecs' CPU float tensors to the (interpreted) kernels, as CUDA ones are."""
    monkeypatch.setattr(fused, "applies", lambda t, dtype=torch.float32: t.dtype == dtype)


@examples(40)
@given(x=arrays32(max_size=600, elements=mixed32), chunk=CHUNKS)
def test_int8_nearest_equals_eager(x, chunk):
    t = t32(x)
    a, q, _, flags = fused.int8_encode(t, chunk)
    ea, eq = quantize_int8(t, chunk, use_native=False)
    assert not flags.any() and torch.equal(a, ea) and torch.equal(q, eq)
    assert torch.equal(fused.int8_decode(a, q, chunk), dequantize_int8(ea, eq, chunk, torch.float32, use_native=False))


@examples(30)
@given(x=arrays32(min_size=1, max_size=600, elements=mixed32), chunk=CHUNKS, seed=st.integers(0, 2**31))
def test_int8_stochastic_equals_eager_on_the_same_uniforms(x, chunk, seed):
    t = t32(x)
    a, q, _, _ = fused.int8_encode(t, chunk, noise=_uniforms(t, chunk, seed))
    ea, eq = quantize_int8(t, chunk, torch.Generator().manual_seed(seed), use_native=False)
    assert torch.equal(a, ea) and torch.equal(q, eq)


def test_int8_philox_stream_keeps_the_bound_and_is_reproducible():
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(1))
    a, q, _, _ = fused.int8_encode(x, 2048, seed=7)
    err = (fused.int8_decode(a, q, 2048).double() - x.double()).abs().numpy()
    assert np.all(err <= int8_bound(x.numpy(), 2048, stochastic=True))
    assert torch.equal(q, fused.int8_encode(x, 2048, seed=7)[1])
    assert not torch.equal(q, fused.int8_encode(x, 2048, seed=8)[1])
    # unbiased: the mean rounding error of a constant chunk is ~0, not the nearest's bias
    c = torch.full((2048 * 40,), 0.3)
    c[::2048] = 1.0  # absmax 1: 0.3 * 127 = 38.1 rounds to 38 or 39
    a, q, _, _ = fused.int8_encode(c, 2048, seed=3)
    mean = float(fused.int8_decode(a, q, 2048)[1::2][:2000].double().mean())
    assert abs(mean - 0.3) < 0.002  # nearest would give 38/127 = 0.2992


@pytest.mark.parametrize("spec", ["ef(int8)", "ef(int8:chunk=64)"])
def test_fused_error_feedback_equals_eager(spec, on_cpu, monkeypatch):
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(5000, generator=g) * 10.0 ** float(i) for i in range(-2, 2)]
    fast = build(spec)
    got = [pack(fast.encode(x, key="b")) for x in xs]
    monkeypatch.setattr(fused, "applies", lambda t, dtype=torch.float32: False)
    slow = build(spec)
    want = [pack(slow.encode(x, key="b")) for x in xs]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(fast.residual.items["b"], slow.residual.items["b"])


def test_fused_error_feedback_stochastic_round_trips(on_cpu):
    c = build("ef(int8:stochastic)", seed=4)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    total = torch.zeros(4096, dtype=torch.float64)
    for _ in range(5):
        total += c.decode(c.encode(x)).double()
    # no mass lost: the sum of decodes plus the residual is the sum of inputs
    assert torch.allclose(total + c.residual.items["default"].double(), 5 * x.double(), atol=1e-4)


def test_fused_error_feedback_non_finite_keeps_state(on_cpu):
    c = build("ef(int8)")
    x = torch.randn(3000)
    c.encode(x)
    before = c.residual.items["default"].clone()
    bad = x.clone()
    bad[2500] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        c.encode(bad)
    assert torch.equal(c.residual.items["default"], before)
    c.residual.items["default"][7] = 3.0e38
    big = torch.zeros(3000)
    big[7] = 3.0e38
    with pytest.raises(ValueError, match="overflows"):
        c.encode(big)
    assert "default" not in c.residual.items


@pytest.mark.parametrize("spec", ["int8", "fp16", "bf16", "topk:0.1+int8", "randk:0.1+bf16"])
def test_codecs_through_the_kernels_equal_eager(spec, on_cpu, monkeypatch):
    x = torch.randn(9000, generator=torch.Generator().manual_seed(5)) * torch.logspace(-4, 4, 9000)
    fast = build(spec, seed=1)
    p = fast.encode(x)
    y = fast.decode(p)
    monkeypatch.setattr(fused, "applies", lambda t, dtype=torch.float32: False)
    slow = build(spec, seed=1)
    q = slow.encode(x)
    assert torch.equal(pack(p), pack(q)) and torch.equal(y, slow.decode(q))


@examples(30)
@given(x=arrays32(max_size=500, elements=mixed32), spec=st.sampled_from(["fp16", "bf16"]))
def test_casts_equal_eager(x, spec):
    t = t32(x)
    with mock.patch.object(fused, "applies", lambda t, dtype=torch.float32: t.dtype == dtype):
        fast = build(spec)
        p = fast.encode(t)
        y = fast.decode(p)
    slow = build(spec)
    q = slow.encode(t)
    z = slow.decode(q)
    assert torch.equal(pack(p), pack(q)) and torch.equal(y, z)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("spec", ["int8", "int8:stochastic", "fp16", "bf16"])
def test_kernels_reject_non_finite(spec, bad, on_cpu):
    x = torch.randn(5000)
    x[4097] = bad
    with pytest.raises(ValueError, match="non-finite"):
        build(spec).encode(x)


@pytest.mark.parametrize("d,k", [(1, 1), (1000, 50), (3_000_017, 3000), (2**40, 100)])
def test_device_index_stream_kernel_equals_torch(d, k):
    seed = DEVICE_STREAM | 0x123456789ABCDEF
    idx = hash_indices(seed, d, k, "cpu")
    assert torch.equal(fused.device_indices(seed, d, k, "cpu"), idx)
    assert int(idx.min()) >= 0 and int(idx.max()) < d
    assert torch.equal(rand_indices(seed, d, k, "cpu"), idx)


def test_device_index_stream_is_uniform():
    d, k = 64, 64_000
    counts = torch.bincount(hash_indices(DEVICE_STREAM | 99, d, k, "cpu"), minlength=d).double()
    chi2 = float(((counts - k / d) ** 2 / (k / d)).sum())
    assert chi2 < 120  # 63 degrees of freedom: p ~ 1e-5


def test_randk_gather_and_a_device_stream_payload_decodes_anywhere():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(3))
    seed = DEVICE_STREAM | 4242
    idx = hash_indices(seed, x.numel(), 1000, "cpu")
    vals = fused.randk_gather(x, seed, 1000)
    assert torch.equal(vals, x[idx])
    c = build("randk:0.1")
    y = c._decode({"seed": torch.tensor([seed - 2**64]), "values.data": vals}, x.numel(), torch.float32)
    want = torch.zeros(10_000).index_add_(0, idx, vals, alpha=10.0)
    assert torch.equal(y, want)

