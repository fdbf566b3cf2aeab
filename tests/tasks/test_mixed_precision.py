"""The learner trains in mixed precision as the simulator charges it: fp32
master weights and AdamW state (16 bytes/parameter with the fp32 gradient), bf16 compute
under autocast, bf16 on the wire."""
import pytest
import torch

from oresearcher.scenario import load_scenario
from oresearcher.sim.memory import bytes_per_param
from oresearcher.tasks.synthetic_lm import make_learner


def _learner(dtype="bf16"):
    sc = load_scenario("scenarios/local-gloo.yaml", [f"workload.dtype={dtype}"])
    return make_learner(sc, 0, mode="numeric")


def test_state_bytes_per_parameter_equal_the_memory_model():
    l = _learner()
    seen = []
    l.module.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    l.forward_backward()
    l.apply_grads(l.grad_buckets())
    assert seen == [torch.bfloat16]  # compute under autocast
    p = l.params[0]
    state = l.optimizer.state[p]
    held = p.element_size() + p.grad.element_size() + state["exp_avg"].element_size() + state["exp_avg_sq"].element_size()
    assert held == sum(bytes_per_param("bf16", "adamw")) == 16


def test_wire_is_bf16_and_masters_keep_their_residual():
    a, b = _learner(), _learner()
    a.forward_backward()
    assert {t.dtype for t in a.grad_buckets()} == {torch.bfloat16}
    assert a.buckets == b.buckets and sum(a.buckets) == a.numel
    a.apply_grads(a.grad_buckets())  # masters now hold bits below bf16
    before = torch.nn.utils.parameters_to_vector(a.params).detach().clone()
    flat = a.flat_params()
    assert flat.dtype == torch.bfloat16
    a.set_flat_params(flat)  # setting what was read back changes nothing
    assert torch.equal(torch.nn.utils.parameters_to_vector(a.params).detach(), before)


def test_fp32_scenarios_unchanged():
    l = _learner("fp32")
    assert l.autocast is None and l.dtype == torch.float32
    l.forward_backward()
    assert {t.dtype for t in l.grad_buckets()} == {torch.float32}


def _held_bytes(learner) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer state) bytes the learner holds; the optimizer's
    per-tensor step counters (one scalar per parameter tensor) are not per-parameter state."""
    params = learner.params
    state = [t for p in params for t in learner.optimizer.state[p].values()
             if isinstance(t, torch.Tensor) and t.numel() == p.numel()]
    return (sum(p.numel() * p.element_size() for p in params),
            sum(p.grad.numel() * p.grad.element_size() for p in params),
            sum(t.numel() * t.element_size() for t in state))


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_each_part_equals_the_simulators_charge(dtype):
    """Not only the total: weights, gradients and optimizer state each hold
    what sim/memory.py charges per parameter, after a real step of a small model."""
    l = _learner(dtype)
    l.forward_backward()
    l.apply_grads(l.grad_buckets())
    n = sum(p.numel() for p in l.params)
    assert _held_bytes(l) == tuple(b * n for b in bytes_per_param(dtype, "adamw"))


def test_sgd_state_equals_the_simulators_charge():
    """SGD keeps one fp32 momentum buffer per parameter, as the simulator charges."""
    sc = load_scenario("scenarios/local-gloo.yaml", ["workload.dtype=bf16", "workload.optimizer=sgd"])
    l = make_learner(sc, 0, mode="numeric")
    l.forward_backward()
    l.apply_grads(l.grad_buckets())
    n = sum(p.numel() for p in l.params)
    assert _held_bytes(l) == tuple(b * n for b in bytes_per_param("bf16", "sgd"))
