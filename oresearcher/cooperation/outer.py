"""Outer optimizer for periodic averaging (DiLoCo) and fusion rounds.

DiLoCo (Douillard et al., 2023, arXiv:2311.08105) treats the change the group made since
the last synchronisation as a *pseudo-gradient* and applies an outer Nesterov-momentum
step to the anchor parameters:

    delta = anchor - averaged            # pseudo-gradient, shape [numel]
    buf   = mu * buf + delta
    new   = anchor - lr * (delta + mu * buf)

With lr = 1 and mu = 0 this is plain averaging (new == averaged). The paper's defaults are
lr 0.7, mu 0.9. Pure tensor math; works on meta tensors (shape mode).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


def nesterov_outer_step(anchor: torch.Tensor, averaged: torch.Tensor, buf: torch.Tensor,
                        lr: float, momentum: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One outer step; returns (new parameters, new momentum buffer)."""
    delta = anchor - averaged
    buf = momentum * buf + delta
    return anchor - lr * (delta + momentum * buf), buf


@dataclass
class OuterNesterov:
    """State of the outer optimizer: the anchor parameters and the momentum buffer."""

    lr: float = 0.7
    momentum: float = 0.9
    anchor: torch.Tensor | None = None
    buf: torch.Tensor | None = None
    steps: int = 0
    extra: dict = field(default_factory=dict)

    def step(self, averaged: torch.Tensor) -> torch.Tensor:
        if self.anchor is None:
            raise RuntimeError("OuterNesterov.step before set_anchor")
        if self.buf is None:
            self.buf = torch.zeros_like(self.anchor)
        new, self.buf = nesterov_outer_step(self.anchor, averaged, self.buf, self.lr, self.momentum)
        self.anchor = new.clone()
        self.steps += 1
        return new

    def set_anchor(self, params: torch.Tensor) -> None:
        self.anchor = params.detach().clone()

    def to(self, device) -> "OuterNesterov":
        """Move the anchor and momentum to ``device`` (a checkpoint loads on the CPU)."""
        self.anchor = None if self.anchor is None else self.anchor.to(device)
        self.buf = None if self.buf is None else self.buf.to(device)
        return self

    def state_dict(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum, "anchor": self.anchor, "buf": self.buf, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.lr, self.momentum = float(state["lr"]), float(state["momentum"])
        self.anchor, self.buf, self.steps = state["anchor"], state["buf"], int(state["steps"])
