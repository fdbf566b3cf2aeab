"""Agent programs and the context they run in.

A program is ``program(ctx, learner) -> generator of ops`` (:data:`ProgramFn`, taking a
:class:`~oresearcher.models.learner.Learner` and returning an
:data:`oresearcher.ops.Program`); the same generator runs in the simulator and on
torch.distributed. Which one a scenario runs is its strategy's
(``scenario.strategy.program_fn``, declared in :mod:`oresearcher.strategies`);
:func:`get_program` is the same lookup by name. The cooperative O-Researcher program lives in
:mod:`oresearcher.programs.cooperative`.

Resuming (the protocol between programs and checkpointing backends):

- A program keeps whatever it carries between steps (outer optimizer, roles,
  allocation, codec error feedback, loop position) in State objects -- things with
  ``state_dict()`` / ``load_state_dict()`` whose state is tensors, numbers, strings,
  lists and dicts, so checkpoints load with ``torch.load(weights_only=True)`` -- and
  hands each to :meth:`AgentContext.register` under a name. Registering loads
  ``ctx.restored[name]`` when the backend restored one.
- Before yielding a StepDone after which its state (plus the learner) is a complete
  snapshot, the program calls :meth:`AgentContext.mark_boundary` with the *nominal* step
  it has just completed (0 .. training.steps-1, the same on every rank). A resumed run
  gets ``ctx.start_step`` = that step + 1 and continues from there.
- With ``start_step == 0`` and nothing restored (the simulator, the reference
  interpreter, a fresh run) registering and marking change nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import torch

from ..ops import Program
from ..scenario import Scenario
from ..models.learner import Learner
from ..seeds import derive

if TYPE_CHECKING:
    from ..codecs import Codec


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
    start_step: int = 0  # resumed run: the first nominal step still to do
    restored: dict = field(default_factory=dict)  # name -> state_dict saved by a checkpoint
    state: dict = field(default_factory=dict)  # name -> State object the program registered
    boundary: Optional[int] = None  # nominal step of the last resumable StepDone (mark_boundary)
    clock: Optional[Callable[[], float]] = None  # the backend's seconds (sim: simulated); None: no clock
    profile: object = None  # sim: the device profile (oresearcher.hardware) host work is priced at; else None
    _codec: object = None

    def register(self, name: str, obj):
        """Save ``obj`` with this agent's checkpoints; load its restored state if any."""
        self.state[name] = obj
        if name in self.restored:
            obj.load_state_dict(self.restored[name])
        return obj

    def mark_boundary(self, step: int) -> None:
        """The next StepDone ends nominal step ``step`` at a point the program can resume from."""
        self.boundary = int(step)

    @property
    def codec(self) -> Optional[Codec]:
        """This agent's gradient codec from ``communication.codec`` (None for "none").

        Built once per agent: error-feedback residuals live in it and are checkpointed
        with the agent. ``seed`` differs per agent (stochastic rounding); ``shared_seed``
        is common to all (rand-k indices need not travel).
        """
        spec = self.scenario.communication.codec  # a CodecSpec, parsed with the scenario
        if self._codec is None and not spec.is_none:
            self._codec = self.register("codec", spec.make(seed=derive(self.scenario.seed, self.rank),
                                                           shared_seed=self.scenario.seed))
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


ProgramFn = Callable[["AgentContext", Learner], Program]


def get_program(strategy: str) -> ProgramFn:
    """The program of the strategy called ``strategy``; ValueError naming the known ones."""
    from ..strategies import get_strategy

    return get_strategy(strategy).program_fn
