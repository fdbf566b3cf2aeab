import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from oresearcher.reporting.units import format_bytes
from oresearcher.sim.memory import bytes_per_param, estimate_memory
from oresearcher.models.workloads import LMCost, measure_lm

GB = 10**9


def hand_cost(params=GB, per_sample=2 * GB, fixed=0, ckpt_per_sample=GB // 5, ckpt_fixed=0,
              dtype="bf16"):
    """An LMCost at micro batch 1 with round numbers, to check the arithmetic by hand."""
    return LMCost(name="hand", micro_batch=1, seq_len=1024, dtype=dtype, checkpointing=False,
                  params=params, param_numels=(params,), fwd_flops=0, bwd_flops=0,
                  recompute_flops=0, activation_bytes=fixed + per_sample,
                  activation_bytes_ckpt=ckpt_fixed + ckpt_per_sample,
                  activation_bytes_fixed=fixed, activation_bytes_ckpt_fixed=ckpt_fixed,
                  checkpoint_recompute_flops=0)


def test_hand_sized_example():
    # 1e9 params in bf16 with AdamW: 4 + 4 + 8 bytes/param (fp32 masters, grads and moments
    # under autocast, as the learner holds them; ZeRO's 16 bytes/param split 2 + 2 + 12);
    # 4 samples of 2 GB saved activations; 0.1 GB of codec buffers
    est = estimate_memory(hand_cost(), micro_batch=4, dtype="bf16", optimizer="adamw",
                          checkpointing=False, codec_buffer_bytes=GB // 10,
                          device_memory_bytes=80 * GB)
    assert (est.weights, est.grads, est.optimizer_state) == (4 * GB, 4 * GB, 8 * GB)
    assert (est.activations, est.codec_buffers) == (8 * GB, GB // 10)
    assert est.total == 24 * GB + GB // 10 and est.fits and est.advice == ""
    assert est.fix_micro_batch is None


def test_fixed_activation_part_does_not_scale():
    est = estimate_memory(hand_cost(fixed=GB // 2), micro_batch=3, device_memory_bytes=80 * GB)
    assert est.activations == GB // 2 + 6 * GB


@pytest.mark.parametrize("dtype,opt,expected", [
    ("bf16", "adamw", (4, 4, 8)), ("fp16", "sgd", (4, 4, 4)),
    ("fp32", "adamw", (4, 4, 8)), ("fp32", "sgd", (4, 4, 4))])
def test_bytes_per_param_conventions(dtype, opt, expected):
    assert bytes_per_param(dtype, opt) == expected
    est = estimate_memory(hand_cost(dtype=dtype), optimizer=opt, device_memory_bytes=80 * GB)
    assert (est.weights, est.grads, est.optimizer_state) == tuple(b * GB for b in expected)


def _fits(cost, m, ckpt, device, codec=0):
    return estimate_memory(cost, micro_batch=m, checkpointing=ckpt, codec_buffer_bytes=codec,
                           device_memory_bytes=device).fits


@pytest.mark.parametrize("ckpt,device,advice,fix", [
    # 16 GB model states + 0.100 GB codec; activations 2 GB/sample, 0.200 GB with checkpointing
    (False, 20 * GB, "enable activation checkpointing (then 16.900 GB of 20.000 GB)", (4, True)),
    (True, 16_500_000_000, "reduce micro batch from 4 to 2 (then 16.500 GB of 16.500 GB)",
     (2, True)),
    (False, 16_500_000_000, "enable activation checkpointing and reduce micro batch from "
     "4 to 2 (then 16.500 GB of 16.500 GB)", (2, True)),
])
def test_advice_names_first_fix_and_it_fits(ckpt, device, advice, fix):
    cost = hand_cost()
    est = estimate_memory(cost, micro_batch=4, checkpointing=ckpt,
                          codec_buffer_bytes=GB // 10, device_memory_bytes=device)
    assert not est.fits and est.advice == advice
    assert (est.fix_micro_batch, est.fix_checkpointing) == fix
    assert _fits(cost, *fix, device, GB // 10)


def test_advice_sharding_when_states_alone_do_not_fit():
    est = estimate_memory(hand_cost(), micro_batch=2, device_memory_bytes=15 * GB)
    assert est.advice == ("needs model sharding (training.strategy: fsdp): the weights+grads+optimizer "
                          "state alone need 16.000 GB of 15.000 GB")
    assert est.fix_micro_batch is None and est.fix_checkpointing is None


def test_advice_sharding_when_even_smallest_setting_does_not_fit():
    est = estimate_memory(hand_cost(), micro_batch=2, device_memory_bytes=16_100_000_000)
    assert "needs model sharding" in est.advice
    assert "even micro batch 1 with activation checkpointing needs 16.200 GB" in est.advice


def test_measured_cost_advice_really_fits():
    cost = measure_lm("llama-tiny", 8, 128)
    full = estimate_memory(cost, device_memory_bytes=10 * GB)
    tight = full.total - 1
    est = estimate_memory(cost, device_memory_bytes=tight)
    assert not est.fits and est.advice.startswith("enable activation checkpointing")
    assert _fits(cost, est.fix_micro_batch, est.fix_checkpointing, tight)


def test_rejects_dtype_other_than_measured():
    with pytest.raises(ValueError, match="measured in bf16"):
        estimate_memory(hand_cost(), dtype="fp32", device_memory_bytes=GB)
    with pytest.raises(ValueError, match="optimizer"):
        estimate_memory(hand_cost(), optimizer="lion", device_memory_bytes=GB)


def test_format_bytes():
    assert format_bytes(80 * GB) == "80.000 GB"
    assert format_bytes(10**7) == "0.010 GB"  # GB from 10 MB up
    assert format_bytes(1_500_000) == "1.500 MB"
    assert format_bytes(0) == "0.000 MB"
    assert format_bytes(8, binary=True) == "8 B"
    assert format_bytes(64 * 2**10, binary=True) == "64 KiB"
    assert format_bytes(3 * 2**19, binary=True) == "1.5 MiB"
    assert format_bytes(1000 * 2**20, binary=True) == "1000 MiB"
    assert format_bytes(8 * 2**30, binary=True) == "8 GiB"


def test_the_advice_and_the_console_print_one_figure_alike():
    """The memory line of the console and the advice under it name the same bytes the
    same way (one formatter), so the two can be read against each other."""
    from rich.console import Console

    from oresearcher.reporting import console as C

    est = estimate_memory(hand_cost(), micro_batch=2, device_memory_bytes=15 * GB)
    mem = {k: getattr(est, k) for k in ("weights", "grads", "optimizer_state", "activations",
                                        "codec_buffers", "total", "fits", "advice")}
    rec = Console(record=True, width=400)
    C.console, real = rec, C.console
    try:
        C.print_report({"memory": mem, "step_time_s": 1.0, "compute_time_s": 1.0, "comm_time_s": 0.0,
                        "exposed_comm_time_s": 0.0, "comm_overhead": 0.0, "peer_wait_time_s": 0.0,
                        "wire_bytes_per_step": 0.0, "breakdown": [], "steps": 1, "world_size": 1}, "t")
    finally:
        C.console = real
    text = rec.export_text()
    assert f"optimizer {format_bytes(est.optimizer_state)}" in text and f"of {format_bytes(15 * GB)}" in text


hand_costs = st.builds(
    hand_cost, params=st.integers(1, 10**10), per_sample=st.integers(1, 10**10),
    fixed=st.integers(0, 10**8), ckpt_per_sample=st.integers(1, 10**10),
    ckpt_fixed=st.integers(0, 10**8))


@settings(max_examples=60, deadline=None)
@given(hand_costs, st.integers(1, 63), st.booleans(), st.integers(0, 10**9))
def test_total_monotone_in_micro_batch(cost, mb, ckpt, codec):
    a, b = (estimate_memory(cost, micro_batch=m, checkpointing=ckpt, codec_buffer_bytes=codec,
                            device_memory_bytes=GB) for m in (mb, mb + 1))
    assert a.total <= b.total


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["gpt-tiny", "llama-tiny"]), st.integers(1, 31), st.booleans(),
       st.sampled_from([32, 128]))
def test_measured_total_monotone_and_checkpointing_never_costs_memory(name, mb, ckpt, T):
    cost = measure_lm(name, 1, T)
    totals = [estimate_memory(cost, micro_batch=m, checkpointing=ckpt,
                              device_memory_bytes=GB).total for m in (mb, mb + 1)]
    assert totals[0] < totals[1]
    with_ckpt = estimate_memory(cost, micro_batch=mb, checkpointing=True, device_memory_bytes=GB)
    assert with_ckpt.total <= estimate_memory(cost, micro_batch=mb, checkpointing=False,
                                              device_memory_bytes=GB).total


def _halvings(m):
    out = []
    while m > 1:
        m //= 2
        out.append(m)
    return out


@settings(max_examples=80, deadline=None)
@given(hand_costs, st.integers(1, 64), st.booleans(), st.integers(1, 10**11))
def test_fix_fits_and_no_earlier_option_does(cost, mb, ckpt, device):
    assume(cost.activation_bytes_ckpt <= cost.activation_bytes)
    est = estimate_memory(cost, micro_batch=mb, checkpointing=ckpt, device_memory_bytes=device)
    if est.fits:
        assert est.advice == ""
        return
    options = ([] if ckpt else [(mb, True)]) + [(m, ckpt) for m in _halvings(mb)] + (
        [] if ckpt else [(m, True) for m in _halvings(mb)])
    fitting = [o for o in options if _fits(cost, *o, device)]
    if fitting:
        assert (est.fix_micro_batch, est.fix_checkpointing) == fitting[0]
    else:
        assert est.fix_micro_batch is None and "needs model sharding" in est.advice
