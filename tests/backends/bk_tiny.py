"""A tiny learner for the backend tests (the real tasks are written elsewhere).

``make_learner`` follows the task interface ``make_learner(scenario, rank, mode=, device=)``
so the CLI can build it with ``--learner tests.backends.tiny:make_learner``.
"""
from __future__ import annotations

import os
import time

import torch
from torch import nn

from oresearcher.models.learner import TorchLearner


def _batches(rank: int, seed: int, device):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    w = torch.randn(8, 2, generator=torch.Generator().manual_seed(seed))
    while True:
        x = torch.randn(16, 8, generator=g)
        yield x.to(device), (x @ w).argmax(1).to(device)


def _loss(module, batch):
    x, y = batch
    return nn.functional.cross_entropy(module(x), y)


def make_learner(scenario, rank, *, mode="real", device="cpu"):
    torch.manual_seed(scenario.seed)  # every agent starts from the same weights
    module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)).to(device)
    opt = torch.optim.SGD(module.parameters(), lr=scenario.training.lr, momentum=0.9)
    learner = TorchLearner(module, opt, _batches(rank, scenario.seed, device), _loss, fwd_flops=1e4, bwd_flops=2e4,
                           bucket_bytes=scenario.communication.bucket_bytes)
    return learner


def make_slow_learner(scenario, rank, *, mode="real", device="cpu"):
    """As make_learner, but every forward/backward takes TINY_SLEEP_S longer (fault tests)."""
    learner = make_learner(scenario, rank, mode=mode, device=device)
    delay = float(os.environ.get("TINY_SLEEP_S", "0.05"))
    fb = learner.forward_backward

    def slow():
        time.sleep(delay)
        return fb()

    learner.forward_backward = slow
    return learner


def make_slow_report_learner(scenario, rank, *, mode="real", device="cpu"):
    """As make_learner; rank 0 takes REPORT_SLEEP_S longer to write its report (longer
    than the run's --timeout: a long run's report and figures)."""
    from oresearcher.backends.run import worker

    if rank == 0:
        write, delay = worker._write_report, float(os.environ.get("REPORT_SLEEP_S", "5"))

        def slow_write(*args, **kwargs):
            time.sleep(delay)
            return write(*args, **kwargs)

        worker._write_report = slow_write
    return make_learner(scenario, rank, mode=mode, device=device)
