"""What a training strategy is, declared once: :class:`Strategy`.

A strategy is the agent program that ``training.strategy`` names plus what the rest of
the house needs to know about it: whether its ranks train one model, whether they are
symmetric, what its report deploys, which run flags and fault actions it takes, what the
convergence model can do with it. Each strategy is one module of
:mod:`oresearcher.strategies` declaring ``STRATEGY = Strategy(...)``; the scenario resolves
the name to the object at load (``scenario.strategy``) and every other module asks the
object. Nothing outside a strategy's own module compares its name.

The declaration sits below the scenario (the scenario refuses, at load, what a strategy
cannot do), so the program, which lives above it in :mod:`oresearcher.programs`, is named
by its import path and imported the first time it runs -- as torch's entry points and
torchtitan's ``TrainSpec`` builders are. A strategy declared outside the package (a test's
toy) passes the function itself.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional, Union


def every_step(scenario) -> int:
    return 1


def no_sharded_agents(scenario) -> int:
    return 0


def ranks_are_agents(raw: dict, ranks: int) -> int:
    return ranks


def never(scenario) -> bool:
    return False


def no_reason(scenario) -> Optional[str]:
    return None


@dataclass(frozen=True)
class FlagUse:
    """A run flag the program reads only in some configurations of the scenario."""

    flag: str  # the flag's name without dashes (oresearcher.backends.run.flags.FLAG_FIELDS)
    when: str  # the configuration, as a refusal names it ("fsdp.replicas=fusion")
    holds: Callable  # (scenario) -> bool: the scenario is in that configuration


@dataclass(frozen=True)
class Strategy:
    name: str  # the scenario's training.strategy
    program: Union[Callable, str]  # (ctx, learner) -> ops, or "module:function" imported on first use
    summary: str = ""  # one line: what the program does
    # every rank trains one model kept equal: its agents cannot differ in architecture, and the model a
    # user deploys is that model (the ranks' mean)
    shares_model: bool = False
    symmetric_ranks: bool = False  # ops depend on a rank only through its data (sim/symmetry.py runs a class once)
    # the cooperative machinery: roles and fusion, privacy, replay, hosted agents, distillation, --export of the
    # fused agents, skip on divergence
    cooperative: bool = False
    # parameters sharded over fsdp.shard_group_size ranks: the sharded memory estimate and roofline share, the
    # FSDP2 learner on the real backend, checkpoints that reshard on resume
    shards: bool = False
    outer_loop: bool = False  # averages every training.local_steps (H) steps: calibration times enough rounds
    needs_every_rank: bool = False  # a failed rank stops it (faults action continue is refused)
    on_divergence: str = "stop"  # training.on_divergence when the scenario leaves it unset
    flags: tuple = ()  # run flags whose fields the program reads: names, or FlagUse where it depends
    check: Optional[Callable] = None  # (scenario) -> None; ValueError of one line naming the field and why
    sync_period: Callable = every_step  # (scenario) -> steps between its averaging collectives (rank drift)
    sharded_agents: Callable = no_sharded_agents  # (scenario) -> ranks per independent sharded agent; 0: a rank
    agents_at: Callable = ranks_are_agents  # (raw scenario mapping, ranks) -> agents the role mix counts
    # (scenario) -> it is synchronous data parallel on exact gradients: the convergence law's own regime
    exact_baseline: Callable = never
    closed_form_curve: bool = False  # that regime's proxy curve is one model stepping on every agent's batch
    no_prediction: Callable = no_reason  # (scenario) -> why the convergence model has nothing for it, or None

    @property
    def program_fn(self) -> Callable:
        """The program itself, imported on first use when declared by its path."""
        if callable(self.program):
            return self.program
        module, _, name = self.program.partition(":")
        return getattr(importlib.import_module(module), name)

    def reads_flag(self, flag: str, scenario) -> bool:
        """Does the program read the field ``--flag`` sets, in ``scenario``'s configuration?"""
        for use in self.flags:
            if use == flag:
                return True
            if isinstance(use, FlagUse) and use.flag == flag:
                return bool(use.holds(scenario))
        return False

    def flag_user(self, flag: str) -> Optional[str]:
        """How a refusal names this strategy as a reader of ``--flag`` (None: it never reads it)."""
        for use in self.flags:
            if use == flag:
                return self.name
            if isinstance(use, FlagUse) and use.flag == flag:
                return f"{self.name} with {use.when}"
        return None
