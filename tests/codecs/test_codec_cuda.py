"""The same codecs on a CUDA device (skipped without one): device kept, bounds hold,
and exact codecs give the CPU's bytes."""
import numpy as np
import pytest
import torch

from codec_ref import int8_bound
from oresearcher.codecs import allgather_exchange, build, pack, two_phase_allreduce
from oresearcher.testing import run_programs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SPECS = ["none", "fp16", "bf16", "int8", "int8:stochastic", "topk:0.01", "topk:0.01:approx", "randk:0.01",
         "topk:0.01+int8", "ef(int8)", "ef21(topk:0.01:approx+int8:stochastic)"]


@pytest.mark.parametrize("spec", SPECS)
def test_round_trip_on_cuda(spec):
    x = torch.randn(300_001, generator=torch.Generator().manual_seed(0))
    c = build(spec, seed=1)
    p = c.encode(x.cuda())
    assert all(t.device.type == "cuda" for t in p.tensors.values())
    assert p.nbytes == c.wire_bytes(x.numel())
    y = c.decode(p)
    assert y.device.type == "cuda" and y.shape == x.shape and y.dtype == x.dtype
    if spec in ("none", "fp16", "bf16", "int8"):  # the same float32 operations: the CPU's bytes
        cpu = build(spec, seed=1)
        assert torch.equal(pack(p).cpu(), pack(cpu.encode(x)))
    if spec == "randk:0.01":  # the device index stream: any receiver regenerates it
        assert int(p.tensors["seed"][0]) < 0  # top bit set
        moved = type(p)({k: t.cpu() for k, t in p.tensors.items()}, p.shape, p.dtype, torch.device("cpu"))
        assert torch.equal(c.decode(moved), y.cpu())
    if spec == "int8":
        err = (y.cpu().double() - x.double()).abs().numpy()
        assert np.all(err <= int8_bound(x.numpy(), 2048))
    if spec.startswith("topk:0.01") and "+" not in spec:
        kept = y != 0
        assert int(kept.sum()) == 3000 and torch.equal(y[kept], x.cuda()[kept])


def test_nan_raises_on_cuda():
    x = torch.randn(1000, device="cuda")
    x[5] = float("nan")
    for spec in SPECS:
        with pytest.raises(ValueError, match="non-finite"):
            build(spec).encode(x)


@pytest.mark.parametrize("scheme", ["allgather", "two_phase"])
def test_collective_on_cuda_matches_cpu(scheme):
    n = 4
    xs = [torch.randn(5000, generator=torch.Generator().manual_seed(r)) for r in range(n)]

    def go(device):
        out = [None] * n

        def prog(r):
            c = build("topk:0.1+int8")
            x = xs[r].to(device)
            if scheme == "allgather":
                out[r] = yield from allgather_exchange(c, x, world_size=n)
            else:
                out[r] = yield from two_phase_allreduce(c, x, rank=r, world_size=n)
        run_programs([prog(r) for r in range(n)])
        return out

    gpu, cpu = go("cuda"), go("cpu")
    assert gpu[0].device.type == "cuda"
    # top-k picks the same elements (no ties in randn); int8 may differ by one step
    assert torch.equal(gpu[0].cpu() != 0, cpu[0] != 0)
    assert torch.allclose(gpu[0].cpu(), cpu[0], rtol=0, atol=float(cpu[0].abs().max()) / 60)


@pytest.mark.parametrize("spec", ["int8", "int8:chunk=64", "fp16", "bf16", "ef(int8)", "randk:0.01+int8"])
def test_triton_path_equals_eager_cuda_and_cpu(spec, monkeypatch):
    """The fused kernels (when triton compiles here) give the eager path's bits; the eager
    CUDA path is the fallback with ORESEARCHER_TRITON=0."""
    from oresearcher.codecs import fused

    if not fused.applies(torch.empty(0, device="cuda")):
        pytest.skip("triton not importable (or interpreted) here: the eager path runs")
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(1_000_003, generator=g) * 10.0 ** e for e in (-3, 0, 3)]
    fast, slow = build(spec), build(spec)
    got = [pack(fast.encode(x.cuda(), key="k")).cpu() for x in xs]
    monkeypatch.setenv("ORESEARCHER_TRITON", "0")
    want = [pack(slow.encode(x.cuda(), key="k")).cpu() for x in xs]
    if not spec.startswith("randk"):  # the CPU's bytes too (randk: the CPU stream differs)
        cpu = build(spec)
        assert all(torch.equal(a, pack(cpu.encode(x, key="k"))) for a, x in zip(got, xs))
    if not spec.startswith("ef"):  # eager CUDA decodes with a*fl(1/127) (torch's scalar
        # division on CUDA multiplies by the reciprocal), so its ef residuals drift from the CPU's
        assert all(torch.equal(a, b) for a, b in zip(got, want))
