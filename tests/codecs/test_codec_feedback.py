"""Error feedback (ef, ef21): telescoping, bounded residuals, keys, checkpoints."""
import io
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from codec_ref import examples
from oresearcher.codecs import build, pack

SETTINGS = examples(40)
EF_SPECS = ["ef(int8)", "ef(int8:stochastic:chunk=16)", "ef(topk:0.2)", "ef(topk:0.2:approx)",
            "ef(topk:0.2+int8)", "ef(randk:0.3)", "ef(fp16)", "ef(bf16)"]


@SETTINGS
@given(spec=st.sampled_from(EF_SPECS), steps=st.integers(1, 6), d=st.integers(1, 200),
       scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e20]), seed=st.integers(0, 1000),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_error_feedback_telescopes(spec, steps, d, scale, seed, dtype):
    """sum_t decode_t + e_T == sum_t x_t: no gradient mass lost. The only error is the
    rounding of v = x + e and e' = v - decode in the compute dtype: at most one unit
    roundoff u of |v| and of |e'| per step (absolute half-spacing for subnormals)."""
    g = torch.Generator().manual_seed(seed)
    c = build(spec, seed=seed)
    u = 2.0**-24 if dtype == torch.float32 else 2.0**-53
    tiny = 2.0**-150 if dtype == torch.float32 else 2.0**-1075
    sent = torch.zeros(d, dtype=torch.float64)
    total = torch.zeros(d, dtype=torch.float64)
    slack = torch.zeros(d, dtype=torch.float64)
    e = torch.zeros(d, dtype=dtype)
    for _ in range(steps):
        x = (torch.randn(d, generator=g, dtype=torch.float64) * scale).to(dtype)
        sent += c.decode(c.encode(x, key="b")).double()
        total += x.double()
        e_new = c.state_dict()["residual"]["b"]
        # relative rounding of both additions, plus half a subnormal spacing each
        slack += (x.double().abs() + e.double().abs() + e_new.double().abs()) * 2 * u + 2 * tiny
        slack += (sent.abs() + total.abs()) * 2.0**-52  # this test's own float64 running sums
        e = e_new
    assert torch.all((sent + e.double() - total).abs() <= slack + 1e-300)


@pytest.mark.parametrize("ratio", [0.05, 0.3])
def test_ef_topk_residual_stays_bounded(ratio):
    """||e|| <= q/(1-q) * max_t ||x_t||, q = sqrt(1 - k/d) (top-k contraction)."""
    d = 400
    c = build(f"ef(topk:{ratio})")
    g = torch.Generator().manual_seed(0)
    q = math.sqrt(1 - round(ratio * d) / d)
    worst, biggest = 0.0, 0.0
    for t in range(60):
        x = torch.randn(d, generator=g) * (1 + t % 7)
        c.encode(x)
        biggest = max(biggest, x.norm().item())
        worst = max(worst, c.state_dict()["residual"]["default"].norm().item())
    assert worst <= q / (1 - q) * biggest * (1 + 1e-5)
    assert worst > 0


def test_ef_int8_residual_stays_bounded():
    """Per element |e| <= absmax(v)/254 (1+slack) with |v| <= |x| + |e|: |e| <= X/253."""
    c = build("ef(int8:chunk=64)")
    g = torch.Generator().manual_seed(1)
    X, worst = 0.0, 0.0
    for _ in range(50):
        x = torch.randn(256, generator=g) * 3
        c.encode(x)
        X = max(X, x.abs().max().item())
        worst = max(worst, c.state_dict()["residual"]["default"].abs().max().item())
    assert 0 < worst <= X / 253 * (1 + 1e-3)


def test_keys_keep_separate_residuals():
    c = build("ef(topk:0.1)")
    a, b = torch.randn(100), torch.randn(30)
    c.encode(a, key="bucket0")
    c.encode(b, key="bucket1")
    res = c.state_dict()["residual"]
    assert res["bucket0"].numel() == 100 and res["bucket1"].numel() == 30
    # the residual of bucket0 is exactly what top-k dropped of a
    dropped = a - build("topk:0.1").decode(build("topk:0.1").encode(a))
    assert torch.equal(res["bucket0"], dropped)
    with pytest.raises(ValueError, match="separate key"):
        c.encode(torch.randn(50), key="bucket0")


@pytest.mark.parametrize("spec", ["ef(int8:stochastic)", "ef21(topk:0.1:approx+int8:stochastic)", "ef(randk:0.2)",
                                  "int8:stochastic", "ef(topk:0.05+fp16)"])
def test_state_survives_a_checkpoint(spec):
    """Save mid-run, reload with torch.load(weights_only=True) into a fresh codec: the
    continued run sends the same bytes as the uninterrupted one."""
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(3000, generator=g) for _ in range(8)]
    a = build(spec, seed=5, shared_seed=6)
    for x in xs[:4]:
        a.encode(x, key="k1")
        a.encode(x[:1000], key="k2")
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = build(spec, seed=5, shared_seed=6)
    b.load_state_dict(torch.load(buf, weights_only=True))
    for x in xs[4:]:
        for key, y in (("k1", x), ("k2", x[:1000])):
            assert torch.equal(pack(a.encode(y, key=key)), pack(b.encode(y, key=key)))


def test_ef21_tracks_a_constant_input_geometrically():
    """||x - h_t||^2 <= (1 - k/d)^t ||x||^2 for top-k (EF21's contraction)."""
    d, ratio = 500, 0.1
    x = torch.randn(d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    c = build(f"ef21(topk:{ratio})")
    for t in range(1, 31):
        c.encode(x)
        gap = (x - c.sender_estimate()).norm() ** 2
        assert gap <= (1 - ratio) ** t * x.norm() ** 2 * (1 + 1e-9)
    assert gap < 1e-2 * x.norm() ** 2


def test_ef21_receiver_aggregate_equals_sum_of_sender_estimates():
    n, d = 3, 200
    senders = [build("ef21(topk:0.1+int8)") for _ in range(n)]
    receiver = build("ef21(topk:0.1+int8)")
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        xs = [torch.randn(d, generator=g, dtype=torch.float64) for _ in range(n)]
        total = sum(s.decode(s.encode(x, key="w")) for s, x in zip(senders, xs))
        agg = receiver.aggregate(total, key="w")
        estimates = sum(s.sender_estimate("w") for s in senders)
        assert torch.allclose(agg, estimates, rtol=0, atol=1e-12)
    # a plain codec's aggregate is the identity
    assert torch.equal(build("int8").aggregate(total), total)


def test_meta_encode_touches_no_state():
    c = build("ef21(randk:0.1)")
    p = c.encode(torch.empty(1000, device="meta"))
    assert p.is_meta and p.nbytes == c.wire_bytes(1000)
    assert c.decode(p).device.type == "meta"
    assert c.state_dict()["estimate"] == {} and c.state_dict()["inner"]["draws"] == {}


def test_overflowing_residual_is_reset_loudly():
    c = build("ef(topk:0.25)")
    c.encode(torch.tensor([3e38, 3e38, 0.0, 0.0]))  # k = 1: the residual keeps one 3e38
    with pytest.raises(ValueError, match="overflows"):
        c.encode(torch.tensor([3e38, 3e38, 0.0, 0.0]))
    assert "default" not in c.state_dict()["residual"]
    c.encode(torch.ones(4))  # usable again
