"""The learner trains in mixed precision as the simulator charges it (issue 11): fp32
master weights and AdamW state (16 bytes/parameter with the fp32 gradient), bf16 compute
under autocast, bf16 on the wire."""
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
