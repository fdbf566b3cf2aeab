"""DiLoCo's outer Nesterov step, computed by hand."""
import pytest
import torch

from oresearcher.cooperation.outer import OuterNesterov, nesterov_outer_step


def test_nesterov_outer_step_by_hand():
    # delta = anchor - averaged = [0.5, 1.0]; buf' = 0.9 * [0.1, 0] + delta = [0.59, 1.0]
    # new = anchor - 0.7 * (delta + 0.9 * buf') = [1 - 0.7 * 1.031, 2 - 0.7 * 1.9] = [0.2783, 0.67]
    anchor = torch.tensor([1.0, 2.0], dtype=torch.float64)
    averaged = torch.tensor([0.5, 1.0], dtype=torch.float64)
    buf = torch.tensor([0.1, 0.0], dtype=torch.float64)
    new, buf2 = nesterov_outer_step(anchor, averaged, buf, lr=0.7, momentum=0.9)
    assert buf2.tolist() == pytest.approx([0.59, 1.0], rel=1e-12)
    assert new.tolist() == pytest.approx([0.2783, 0.67], rel=1e-12)


def test_lr_one_no_momentum_is_plain_averaging():
    anchor, averaged = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    new, _ = nesterov_outer_step(anchor, averaged, torch.zeros(5, dtype=torch.float64), lr=1.0, momentum=0.0)
    assert torch.allclose(new, averaged, rtol=0, atol=1e-15)


def test_state_object_carries_the_buffer_between_steps():
    opt = OuterNesterov(lr=0.7, momentum=0.9)
    opt.anchor = torch.tensor([1.0, 2.0], dtype=torch.float64)
    opt.buf = torch.tensor([0.1, 0.0], dtype=torch.float64)
    out = opt.step(torch.tensor([0.5, 1.0], dtype=torch.float64))
    assert out.tolist() == pytest.approx([0.2783, 0.67], rel=1e-12)
    assert opt.anchor.tolist() == out.tolist() and opt.buf.tolist() == pytest.approx([0.59, 1.0], rel=1e-12)
    # the second step starts from the new anchor and the carried buffer
    # delta = [0.2783, 0.67] - [0.2783, 0.67] = 0; buf'' = 0.9 * [0.59, 1.0]; new = anchor - 0.7 * 0.9 * buf''
    out2 = opt.step(out.clone())
    assert out2.tolist() == pytest.approx([0.2783 - 0.63 * 0.531, 0.67 - 0.63 * 0.9], rel=1e-12)
