"""bk_tiny's learner, made non-finite on one rank at one step (divergence tests).

POISON_RANK ("all": every rank) and POISON_STEP (environment) say where: the gradients of that rank's
forward/backward call number POISON_STEP (0-based) are NaN.
"""
from __future__ import annotations

import os
import signal

import torch

from bk_tiny import make_learner


def make_nan_learner(scenario, rank, *, mode="real", device="cpu"):
    learner = make_learner(scenario, rank, mode=mode, device=device)
    who = os.environ.get("POISON_RANK", "1")
    if who != "all" and rank != int(who):
        return learner
    at, calls, fb = int(os.environ.get("POISON_STEP", "3")), [0], learner.forward_backward

    def poisoned():
        metrics = fb()
        if calls[0] == at:
            for p in learner.params:
                p.grad.fill_(float("nan"))
        calls[0] += 1
        return metrics

    learner.forward_backward = poisoned
    return learner


def make_dying_learner(scenario, rank, *, mode="real", device="cpu"):
    """The task's learner whose rank DIE_RANK is killed (SIGKILL) at forward/backward call
    DIE_STEP, on the first attempt only (TORCHELASTIC_RESTART_COUNT 0): a lost GPU under
    torchrun --max-restarts."""
    from oresearcher.tasks import make_learner as task_learner  # its data stream resumes exactly

    learner = task_learner(scenario, rank, mode=mode, device=device)
    if rank != int(os.environ.get("DIE_RANK", "1")) or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return learner
    at, calls, fb = int(os.environ.get("DIE_STEP", "7")), [0], learner.forward_backward

    def dying():
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        return fb()

    learner.forward_backward = dying
    return learner


class _NaNGrad(torch.autograd.Function):
    """Identity forward, NaN backward: a finite loss whose gradients are all NaN."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def make_nan_fsdp_learner(scenario, rank, *, mode="real", device="cpu"):
    """The fsdp learner (fully_shard) whose rank POISON_RANK ("all": every rank) computes
    NaN gradients, before FSDP reduce-scatters them, at forward/backward call POISON_STEP."""
    import torch.distributed as dist

    from oresearcher.backends.fsdp.learner import make_learner as fsdp_learner
    from oresearcher.models import lm_loss

    learner = fsdp_learner(scenario, rank, dist.get_world_size(), device)
    who = os.environ.get("POISON_RANK", "1")
    if who != "all" and rank != int(who):
        return learner
    at, calls = int(os.environ.get("POISON_STEP", "3")), [0]

    def loss_fn(module, batch):
        logits = module(batch[:, :-1])
        if calls[0] == at:
            logits = _NaNGrad.apply(logits)
        calls[0] += 1
        return lm_loss(logits, batch[:, 1:])

    learner.loss_fn = loss_fn
    return learner
