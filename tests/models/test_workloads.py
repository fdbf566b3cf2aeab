import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from oresearcher.models import PRESETS, build_model, lm_loss
from oresearcher.models.workloads import (DDP_FIRST_BUCKET_BYTES, _meta_lm_trace,
                                   bucket_sizes, measure_lm, measure_module)

SMALL = ["gpt-tiny", "llama-tiny", "gpt-small-cpu"]


# ---- measure_module: golden numbers derived by hand ----------------------------------

def test_linear_golden_flops_and_activation_bytes():
    B, d_in, d_out = 8, 32, 16
    x = torch.randn(B, d_in, requires_grad=True)
    fwd, bwd, act = measure_module(nn.Linear(d_in, d_out), (x,), lambda y: y.sum())
    assert fwd == 2 * B * d_in * d_out
    assert bwd == 2 * fwd  # grad wrt input and wrt weight: one matmul each
    assert act == B * d_in * 4  # the input, fp32; the weight is not an activation


def test_linear_input_without_grad_needs_only_weight_grad():
    B, d_in, d_out = 4, 10, 6
    fwd, bwd, _ = measure_module(nn.Linear(d_in, d_out, bias=False),
                                 (torch.randn(B, d_in),), lambda y: y.sum())
    assert (fwd, bwd) == (2 * B * d_in * d_out, 2 * B * d_in * d_out)


def test_mlp_on_digits_golden_and_no_grad_side_effect():
    # a digits-sized MLP: 64 -> 32 -> 10; ReLU saves its output, which the second
    # Linear saves too (one storage); the first Linear saves the input
    mlp = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    B = 5
    fwd, bwd, act = measure_module(mlp, (torch.randn(B, 64),), lambda y: y.sum())
    assert fwd == 2 * B * (64 * 32 + 32 * 10)
    assert bwd == 2 * B * 64 * 32 + 2 * 2 * B * 32 * 10
    assert act == B * 64 * 4 + B * 32 * 4
    assert all(p.grad is None for p in mlp.parameters())


def test_meta_and_cpu_measurements_agree():
    mlp = nn.Sequential(nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 4))
    cpu = measure_module(mlp, (torch.randn(3, 16),), lambda y: y.sum())
    meta = measure_module(mlp.to("meta"), (torch.empty(3, 16, device="meta"),),
                          lambda y: y.sum())
    assert cpu == meta


# ---- measure_lm ----------------------------------------------------------------------

def _hand_flops(name, B, T):
    """Matmul FLOPs by hand: 2 per multiply-add of every weight matrix per token, plus
    attention's two T x T matmuls per head (4*B*T^2*d per layer, full matrix as
    FlopCounterMode counts it); backward 2x for matmuls, 2.5x for flash attention."""
    c = PRESETS[name]
    kv = c.kv_heads * c.head_dim
    mlp = (3 if c.style == "llama" else 2) * c.d_model * c.ffn
    weights = c.n_layer * (c.d_model * (c.d_model + 2 * kv) + c.d_model ** 2 + mlp)
    weights += c.d_model * c.vocab_size  # LM head
    linear, attn = 2 * B * T * weights, c.n_layer * 4 * B * T * T * c.d_model
    return linear + attn, 2 * linear + 5 * attn // 2


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_lm_flops_match_hand_count(name):
    cost = measure_lm(name, 2, 64, "fp32")
    assert (cost.fwd_flops, cost.bwd_flops) == _hand_flops(name, 2, 64)
    assert cost.params == sum(cost.param_numels) == sum(
        p.numel() for p in build_model(name).parameters())


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
@pytest.mark.parametrize("mb", [3, 5])
def test_micro_batch_extrapolation_equals_direct_measurement(name, mb):
    cost = measure_lm(name, mb, 48, "bf16")
    direct = _meta_lm_trace(name, mb, 48, "bf16", backward=True)
    assert cost.fwd_flops == direct.fwd_flops and cost.bwd_flops == direct.bwd_flops
    assert cost.activation_bytes == direct.activation_bytes()
    assert cost.activation_bytes_ckpt == direct.activation_bytes_ckpt()
    assert cost.checkpoint_recompute_flops == direct.recompute_flops


def test_flops_linear_in_micro_batch():
    one, four = measure_lm("llama-tiny", 1, 32), measure_lm("llama-tiny", 4, 32)
    assert four.fwd_flops == 4 * one.fwd_flops and four.bwd_flops == 4 * one.bwd_flops


def _real_checkpoint_run(name, B, T):
    """fwd+bwd FLOPs and the bytes kept through forward, with torch.utils.checkpoint
    really on: its own hooks take the saves inside blocks; the outer hook sees the saves
    outside blocks and the block inputs checkpoint keeps (it saves them for backward)."""
    model = build_model(name, dtype=torch.bfloat16)
    model.activation_checkpointing = True
    tokens = torch.zeros(B, T, dtype=torch.long, device="meta")
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saved, alive = {}, []

    def pack(t):
        s = t.untyped_storage()
        if s._cdata not in params:
            alive.append(t)
            saved[s._cdata] = s.nbytes()
        return t

    with FlopCounterMode(display=False) as fc:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = lm_loss(model(tokens), tokens)
        torch.autograd.grad(loss, list(model.parameters()))
    return fc.get_total_flops(), sum(saved.values())


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_checkpointing_matches_real_torch_checkpoint(name):
    flops, kept = _real_checkpoint_run(name, 2, 32)
    cost = measure_lm(name, 2, 32, "bf16", checkpointing=True)
    assert cost.recompute_flops > 0
    assert flops == cost.step_flops == cost.fwd_flops + cost.bwd_flops + cost.recompute_flops
    assert measure_lm(name, 2, 32, "bf16").recompute_flops == 0
    traced = _meta_lm_trace(name, 2, 32, "bf16", backward=False)
    assert kept == sum(n for _, n in traced.outside | traced.block_inputs)
    assert traced.block_inputs - traced.outside and traced.outside  # both parts present


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(SMALL), st.integers(1, 16), st.integers(4, 256))
def test_checkpointing_never_increases_activation_bytes(name, mb, T):
    cost = measure_lm(name, mb, T)
    assert 0 < cost.activation_bytes_ckpt <= cost.activation_bytes
    assert cost.saved_activation_bytes(True) == cost.activation_bytes_ckpt


def test_checkpointing_saves_most_activation_memory_of_a_deep_model():
    # 24 layers: checkpointing keeps 24 block inputs + one block's saves + the fp32
    # log-softmax of the loss. (In gpt-125m that log-softmax, T x 50257 x 4 bytes, is
    # most of what is saved, so checkpointing only halves it.)
    cost = measure_lm("gpt-1.3b", 1, 1024)
    assert cost.activation_bytes_ckpt < 0.25 * cost.activation_bytes


def test_measure_lm_is_cached_and_validates():
    assert measure_lm("gpt-tiny", 2, 16) is measure_lm("gpt-tiny", 2, 16)
    with pytest.raises(ValueError, match="known"):
        measure_lm("nope", 1, 16)
    with pytest.raises(ValueError, match="dtype"):
        measure_lm("gpt-tiny", 1, 16, "int8")
    with pytest.raises(ValueError, match="max_seq_len"):
        measure_lm("gpt-tiny", 1, 512)
    with pytest.raises(ValueError):
        measure_lm("gpt-tiny", 0, 16)


def test_at_micro_batch_round_trip():
    cost = measure_lm("llama-tiny", 4, 64, checkpointing=True)
    assert cost.at_micro_batch(2) == measure_lm("llama-tiny", 2, 64, checkpointing=True)
    assert cost.at_micro_batch(4, checkpointing=False) == measure_lm("llama-tiny", 4, 64)


# ---- gradient buckets ----------------------------------------------------------------

def test_bucket_sizes_golden():
    # reversed: 30, 20, 10 params of 4 bytes = 120, 80, 40 bytes.
    # First cap 50: 120 >= 50 closes at once; then 80 < 100, 80 + 40 >= 100 closes.
    assert bucket_sizes([10, 20, 30], 100, 4, first_bucket_bytes=50) == [30, 30]
    # uniform cap 200: 120 + 80 >= 200 closes; 40 is left for a last, smaller bucket
    assert bucket_sizes([10, 20, 30], 200, 4, first_bucket_bytes=None) == [50, 10]
    assert bucket_sizes([1], 100, 4) == [1]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=30),
       st.integers(1, 20000), st.sampled_from([2, 4]),
       st.one_of(st.none(), st.integers(1, 20000)))
def test_bucket_sizes_match_torch_ddp_assignment(numels, cap, elem, first):
    ours = bucket_sizes(numels, cap, elem, first_bucket_bytes=first)
    tensors = [torch.empty(n, dtype=torch.float16 if elem == 2 else torch.float32,
                           device="meta") for n in reversed(numels)]
    limits = [cap] if first is None else [first, cap]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    assert ours == [sum(numels[::-1][i] for i in b) for b in buckets]
    assert sum(ours) == sum(numels) and min(ours) > 0


def test_ddp_default_first_bucket_is_torch_default():
    assert DDP_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES
