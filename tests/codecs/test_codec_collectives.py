"""Compressed collectives run by the reference interpreter at world sizes 2, 3, 4, 8."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from codec_ref import INT8_ABS, INT8_SLACK, examples, t32
from oresearcher import ops as O
from oresearcher.codecs import allgather_exchange, build, collective_wire_bytes_per_rank, two_phase_allreduce
from oresearcher.testing import run_programs, tap

WORLDS = [2, 3, 4, 8]
SPECS = ["none", "int8", "int8:stochastic", "fp16", "topk:0.1", "topk:0.1+int8", "randk:0.2", "ef(topk:0.1+int8)"]


def _recorded(gen, log):
    """Pass ``gen``'s ops through, logging them; returns its return value."""
    return (yield from tap(gen, log.append))


def run(scheme, codecs, xs, group=None, world=None, **kw):
    """Run one compressed collective on every member; (results, ops) per rank."""
    world = world or len(xs)
    members = list(range(world)) if group is None else list(group)
    results, logs = [None] * world, [[] for _ in range(world)]

    def program(r):
        if r not in members:
            return
        if scheme == "allgather":
            g = allgather_exchange(codecs[r], xs[r], group=group, world_size=world, key="b", **kw)
        else:
            g = two_phase_allreduce(codecs[r], xs[r], rank=r, group=group, world_size=world, key="b", **kw)
        results[r] = yield from _recorded(g, logs[r])

    run_programs([program(r) for r in range(world)])
    return results, logs


def local_pipeline(scheme, spec, xs):
    """The same compression steps done locally, one fresh codec per rank (same seeds)."""
    n = len(xs)
    cs = [build(spec, seed=r, shared_seed=9) for r in range(n)]
    if scheme == "allgather":
        dec = [c.decode(c.encode(x, key="b")) for c, x in zip(cs, xs)]
        return sum((d.double() for d in dec[1:]), dec[0].double()).float()
    numel = xs[0].numel()
    c = -(-numel // n)
    pad = [torch.cat([x.reshape(-1), torch.zeros(n * c - numel)]).view(n, c) for x in xs]
    sent = [[cs[r].encode(pad[r][j], key=f"b/rs{j}") for j in range(n)] for r in range(n)]
    owned = [sum((cs[j].decode(sent[r][j]).double() for r in range(n)), torch.zeros(c, dtype=torch.float64)).float()
             for j in range(n)]
    back = [cs[j].decode(cs[j].encode(owned[j], key=f"b/ag{j}")) for j in range(n)]
    return torch.cat(back)[:numel].reshape(xs[0].shape)


def inputs(n, numel, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g) for _ in range(n)]


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("scheme", ["allgather", "two_phase"])
@pytest.mark.parametrize("spec", SPECS)
def test_matches_local_pipeline_and_all_ranks_agree(n, scheme, spec):
    xs = inputs(n, 203, seed=n)
    codecs = [build(spec, seed=r, shared_seed=9) for r in range(n)]
    results, _ = run(scheme, codecs, xs)
    expected = local_pipeline(scheme, spec, xs)
    for r in range(n):
        assert torch.equal(results[r], expected)
    if spec == "none":  # exact: the float64 sum rounded once
        assert torch.equal(results[0], sum(x.double() for x in xs).float())


bounded = st.floats(-2.0**100, 2.0**100, width=32)  # sums stay finite in float32


@examples(40)
@given(n=st.sampled_from(WORLDS), numel=st.integers(1, 300), data=st.data(), scheme=st.sampled_from(["allgather", "two_phase"]))
def test_int8_collectives_keep_the_int8_bound(n, numel, data, scheme):
    """|result - sum x| within the int8 bounds of every compression step (float64)."""
    from hypothesis.extra.numpy import arrays
    xs = [data.draw(arrays(np.float32, numel, elements=bounded)) for _ in range(n)]
    results, _ = run(scheme, [build("int8") for _ in range(n)], [t32(x) for x in xs])
    got = results[0].numpy().astype(np.float64)
    X = np.stack([x.astype(np.float64) for x in xs])
    S = X.sum(0)
    u = 2.0**-24
    if scheme == "allgather":
        b1 = (np.abs(X).max(1, keepdims=True) / 254 * (1 + INT8_SLACK) + INT8_ABS).sum(0)  # one chunk per rank
        bound = b1 + u * (np.abs(S) + b1) + 2.0**-50 * np.abs(X).sum(0)
    else:
        c = -(-numel // n)
        bound = np.zeros(numel)
        for j in range(n):
            J = slice(j * c, min(numel, (j + 1) * c))
            if J.start >= numel:
                continue
            b1 = (np.abs(X[:, J]).max(1) / 254 * (1 + INT8_SLACK) + INT8_ABS).sum()
            A2 = (np.abs(S[J]).max() + b1) * (1 + 2 * u)
            b2 = A2 / 254 * (1 + INT8_SLACK) + INT8_ABS
            bound[J] = b1 + u * (np.abs(S[J]) + b1) + b2 + 2.0**-50 * np.abs(X[:, J]).sum(0)
    assert np.all(np.abs(got - S) <= bound)


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("scheme", ["allgather", "two_phase"])
@pytest.mark.parametrize("spec", ["none", "int8", "fp16", "topk:0.1", "topk:0.1+int8"])
def test_rank_order_does_not_change_the_aggregate(n, scheme, spec):
    """Permuting the inputs between ranks gives a bit-identical result (per element the
    decoded terms of these inputs span far less than 2**28, so float64 sums are exact)."""
    xs = inputs(n, 150, seed=10 + n)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n)).tolist()
    a, _ = run(scheme, [build(spec) for _ in range(n)], xs)
    b, _ = run(scheme, [build(spec) for _ in range(n)], [xs[p] for p in perm])
    assert torch.equal(a[0], b[0])


@examples(30)
@given(n=st.sampled_from(WORLDS), data=st.data())
def test_allgather_order_independent_within_float64_rounding(n, data):
    from hypothesis.extra.numpy import arrays
    xs = [data.draw(arrays(np.float32, 20, elements=bounded)) for _ in range(n)]
    perm = data.draw(st.permutations(range(n)))
    a, _ = run("allgather", [build("none")] * n, [t32(x) for x in xs])
    b, _ = run("allgather", [build("none")] * n, [t32(xs[p]) for p in perm])
    absum = np.abs(np.stack(xs).astype(np.float64)).sum(0)
    diff = np.abs(a[0].numpy().astype(np.float64) - b[0].numpy())
    assert np.all(diff <= 2.0**-23 * np.abs(a[0].numpy()) + n * 2.0**-52 * absum + 2.0**-149)


def _bytes_sent(op, n):
    """Bytes one rank sends for ``op`` on a ring (all-gather) or pairwise (all-to-all)."""
    if isinstance(op, O.Compute):
        return 0  # encode/decode work: local, nothing on the wire
    if isinstance(op, O.AllGather):
        return (n - 1) * O.tensor_bytes(op.tensor)
    if isinstance(op, O.AllToAll):
        return sum(O.tensor_bytes(t) for t in op.tensors) * (n - 1) / n
    raise AssertionError(f"unexpected op {op}")


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("scheme", ["allgather", "two_phase"])
@pytest.mark.parametrize("spec", ["none", "int8", "topk:0.01+int8", "ef(randk:0.05)", "ef21(fp16)"])
def test_shape_mode_yields_the_priced_bytes(n, scheme, spec):
    numel = 10_007
    meta = [torch.empty(numel, device="meta") for _ in range(n)]
    res, logs = run(scheme, [build(spec) for _ in range(n)], meta)
    assert all(r.device.type == "meta" and r.shape == (numel,) for r in res)
    c = build(spec)
    sent = sum(_bytes_sent(op, n) for op in logs[0])
    assert sent == pytest.approx(collective_wire_bytes_per_rank(scheme, c, numel, n), rel=1e-12)
    # numeric mode yields ops of exactly the same sizes
    _, real = run(scheme, [build(spec) for _ in range(n)], inputs(n, numel, 0))
    assert [_bytes_sent(op, n) for op in real[0]] == [_bytes_sent(op, n) for op in logs[0]]


def test_trade_off_at_eight_ranks():
    """An all-gather of 4x-compressed payloads moves as many bytes per rank as a plain
    ring all-reduce at 8 ranks; the two-phase scheme keeps the 4x saving."""
    n, numel, int8 = 8, 25_000_000, build("int8")
    plain = collective_wire_bytes_per_rank("allreduce", None, numel, n)
    ag = collective_wire_bytes_per_rank("allgather", int8, numel, n)
    tp = collective_wire_bytes_per_rank("two_phase", int8, numel, n)
    assert plain == 2 * 7 / 8 * numel * 4
    assert 1.0 <= ag / plain <= 1.002
    assert 0.25 <= tp / plain <= 0.2506


@pytest.mark.parametrize("scheme", ["allgather", "two_phase"])
@pytest.mark.parametrize("spec", ["ef(int8)", "ef(topk:0.3)", "ef(randk:0.3+int8)"])
def test_error_feedback_in_collectives_loses_no_mass(scheme, spec):
    """sum_t result_t + all residuals (workers', and the owners' server residuals in the
    two-phase scheme) == sum_t sum_i x_i, in float64."""
    n, numel, steps = 4, 64, 5
    codecs = [build(spec, seed=r) for r in range(n)]
    g = torch.Generator().manual_seed(5)
    out = torch.zeros(numel, dtype=torch.float64)
    total = torch.zeros(numel, dtype=torch.float64)
    for _ in range(steps):
        xs = [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(n)]
        res, _ = run(scheme, codecs, xs)
        out += res[0]
        total += sum(xs)
    residual = torch.zeros(numel, dtype=torch.float64)
    for r, c in enumerate(codecs):
        keys = c.state_dict()["residual"]
        if scheme == "allgather":
            residual += keys["b"]
        else:
            residual += torch.cat([keys[f"b/rs{j}"] for j in range(n)])
            residual[r * numel // n:(r + 1) * numel // n] += keys[f"b/ag{r}"]
    assert torch.allclose(out + residual, total, rtol=0, atol=1e-10)
    assert residual.abs().max() > 0


@pytest.mark.parametrize("scheme", ["allgather", "two_phase"])
def test_ef21_collective_converges_to_the_sum(scheme):
    n, numel = 3, 90
    xs = inputs(n, numel, seed=3)
    codecs = [build("ef21(topk:0.2)") for _ in range(n)]
    exact = sum(x.double() for x in xs)
    errs = []
    for _ in range(40):
        res, _ = run(scheme, codecs, xs)
        assert all(torch.equal(res[0], r) for r in res)
        errs.append((res[0].double() - exact).norm().item())
    assert errs[-1] < 1e-4 * exact.norm().item() and errs[-1] < errs[0]


@pytest.mark.parametrize("scheme", ["allgather", "two_phase"])
def test_average_and_subgroups(scheme):
    xs = inputs(4, 33, seed=4)
    group = (0, 2, 3)
    res, _ = run(scheme, [build("none") for _ in range(4)], xs, group=group, world=4, average=True)
    expected = (sum(xs[r].double() for r in group) / 3).float()
    assert res[1] is None
    for r in group:
        assert torch.allclose(res[r], expected, rtol=2**-22, atol=0)


def test_two_phase_needs_its_rank_in_the_group():
    with pytest.raises(ValueError, match="not in group"):
        next(two_phase_allreduce(build("int8"), torch.randn(8), rank=1, group=(0, 2)))
    with pytest.raises(ValueError, match="scheme"):
        collective_wire_bytes_per_rank("ring", build("int8"), 10, 2)
