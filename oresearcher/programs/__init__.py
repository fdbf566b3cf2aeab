"""Agent programs and the context they run in.

A program is ``program(ctx, learner) -> generator of ops``; the same generator runs in
the simulator and on torch.distributed. :func:`get_program` maps the scenario's
``training.strategy`` to one. The cooperative O-Researcher program lives in
:mod:`oresearcher.programs.cooperative`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..scenario import Scenario

_PROGRAMS = {
    "ddp": ("oresearcher.programs.data_parallel", "ddp"),
    "local_sgd": ("oresearcher.programs.data_parallel", "local_sgd"),
    "diloco": ("oresearcher.programs.data_parallel", "diloco"),
    "single": ("oresearcher.programs.data_parallel", "single"),
    "oresearcher": ("oresearcher.programs.cooperative", "cooperative"),
}


@dataclass
class AgentContext:
    """What one rank's program knows about where it runs.

    mode: "shape" (meta tensors, sim), "numeric" (real values, sim) or "real"
    (torch.distributed). group: the ranks it trains with (None: the world).
    """

    rank: int
    world_size: int
    scenario: Scenario
    mode: str = "shape"
    device: torch.device = torch.device("cpu")
    group: Optional[tuple] = None
    eval_every: Optional[int] = None  # None: training.eval_every; 0: only after the last step
    _codec: object = None

    @property
    def codec(self):
        """This agent's gradient codec from ``communication.codec`` (None for "none").

        Built once per agent: error-feedback residuals live in it and are checkpointed
        with the agent. ``seed`` differs per agent (stochastic rounding); ``shared_seed``
        is common to all (rand-k indices need not travel).
        """
        spec = self.scenario.communication.codec
        if spec == "none":
            return None
        if self._codec is None:
            from ..codecs import build

            self._codec = build(spec, seed=self.scenario.seed * 1009 + self.rank, shared_seed=self.scenario.seed)
        return self._codec

    @property
    def steps(self) -> int:
        return self.scenario.training.steps

    @property
    def numeric(self) -> bool:
        return self.mode != "shape"

    @property
    def eval_interval(self) -> int:
        """Steps between evaluations (0: only after the last step)."""
        return self.scenario.training.eval_every if self.eval_every is None else self.eval_every

    def should_eval(self, step: int) -> bool:
        last = step == self.steps - 1
        every = self.eval_interval
        return self.numeric and (last or (every > 0 and (step + 1) % every == 0))


def get_program(strategy: str) -> Callable:
    if strategy not in _PROGRAMS:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(_PROGRAMS)}")
    module, name = _PROGRAMS[strategy]
    return getattr(importlib.import_module(module), name)
