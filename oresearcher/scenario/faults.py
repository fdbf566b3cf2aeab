"""The scenario's ``faults:`` section: what goes wrong in a simulated run (sim/faults.py).

Validated at the boundary like the rest of the scenario (unknown keys are errors, every
number has a finite range). Units: seconds (``_s``), ratios (``factor``).

    faults:
      stragglers:                       # a rank's Compute ops take factor x longer
        - {ranks: [3], factor: 1.5}     # fixed
        - {distribution: lognormal, cv: 0.2}   # every rank: a factor drawn once, seeded, mean 1
      links:                            # every flow started in the window moves at factor x bandwidth
        - {start_s: 30, duration_s: 10, bandwidth_factor: 0.25}
      failures:                         # a rank (its GPU or node) is lost at a time
        - {at_s: 120, rank: 2, action: restart}   # all ranks restart from the last checkpoint
        - {at_s: 300, rank: 5, action: continue}  # the others go on without it
        - {at_s: 500, rank: 8, scope: node, action: continue}   # rank 8's whole node
      mtbf_s: 3600                      # and/or random job failures, exponential, seeded (restart)
      restart_delay_s: 60               # detection + rescheduling + process start, before the restore

Checkpoints are ``training.checkpoint_every``; their cost comes from the bytes each rank
saves and the device profile's ``storage_bandwidth_GBps``.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from .types import MAX_WORLD, Float, Int
from .types import Strict as _Strict

MAX_TIME_S = 1e9  # ~32 years of simulated time
Seconds = Annotated[Float, Field(ge=0, le=MAX_TIME_S)]


class StragglerSpec(_Strict):
    ranks: list[Annotated[Int, Field(ge=0, lt=MAX_WORLD)]] = Field(
        default_factory=list, max_length=MAX_WORLD, description="slow ranks (empty: every rank)")
    factor: Optional[Float] = Field(None, ge=1, le=100, description="compute time multiplier (ratio, fixed)")
    distribution: Optional[Literal["lognormal", "uniform"]] = Field(
        None, description="draw each rank's factor once, seeded: lognormal with mean 1 and cv, or uniform "
        "between low and high")
    cv: Float = Field(0.1, ge=0, le=10, description="lognormal coefficient of variation (ratio)")
    low: Float = Field(1.0, ge=0.01, le=100, description="uniform: smallest factor (ratio)")
    high: Float = Field(1.5, ge=0.01, le=100, description="uniform: largest factor (ratio)")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.factor is None) == (self.distribution is None):
            raise ValueError("a straggler has a fixed factor or a distribution (one of the two)")
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self


class LinkSpec(_Strict):
    start_s: Seconds = Field(description="window start, simulated seconds")
    duration_s: Annotated[Float, Field(gt=0, le=MAX_TIME_S)] = Field(description="window length, seconds")
    bandwidth_factor: Float = Field(0.5, gt=0, le=1, description="bandwidth left on every link (ratio, 0..1]")


class FailureSpec(_Strict):
    at_s: Seconds = Field(description="when the rank is lost, simulated seconds")
    rank: Int = Field(0, ge=0, lt=MAX_WORLD, description="the lost rank (its GPU), or a rank of the lost node")
    scope: Literal["gpu", "node"] = Field("gpu", description="gpu: that rank alone; node: every rank of its node")
    action: Literal["restart", "continue"] = Field(
        "restart", description="restart: every rank restarts from the last complete checkpoint after "
        "restart_delay_s; continue: the others go on without it (oresearcher, local_sgd, diloco, single)")


class FaultsSpec(_Strict):
    seed: Optional[Int] = Field(None, ge=0, le=2**32 - 1, description="draws of stragglers and random failures "
                                "(default: the scenario's seed)")
    stragglers: list[StragglerSpec] = Field(default_factory=list, max_length=64)
    links: list[LinkSpec] = Field(default_factory=list, max_length=1024)
    failures: list[FailureSpec] = Field(default_factory=list, max_length=1024)
    mtbf_s: Optional[Annotated[Float, Field(gt=0, le=MAX_TIME_S)]] = Field(
        None, description="mean time between random job failures (exponential, seeded; each restarts)")
    restart_delay_s: Seconds = Field(60.0, description="from a failure to the restarted ranks reading the "
                                     "checkpoint, seconds")
    price_checkpoints: bool = Field(False, description="price training.checkpoint_every's saves even without "
                                    "faults (with any fault they are always priced)")

    @model_validator(mode="after")
    def _restarts_end(self):
        # every restart pauses the job restart_delay_s, and random failures keep coming meanwhile:
        # at mtbf_s <= restart_delay_s each pause brings at least one more failure on average,
        # so the pauses never end (a critical or supercritical branching process)
        if self.mtbf_s is not None and self.mtbf_s <= self.restart_delay_s:
            raise ValueError(f"mtbf_s={self.mtbf_s:g} s is not longer than a restart (restart_delay_s="
                             f"{self.restart_delay_s:g} s): failures would come faster than restarts end and "
                             "the job could never finish")
        return self

    @property
    def active(self) -> bool:
        return bool(self.stragglers or self.links or self.failures or self.mtbf_s)

    def check(self, world: int, strategy) -> None:
        """Ranks inside the world; ``continue`` only where the program can lose an agent."""
        for i, s in enumerate(self.stragglers):
            bad = [r for r in s.ranks if r >= world]
            if bad:
                raise ValueError(f"faults.stragglers.{i}.ranks: rank {bad[0]} is outside the {world} ranks")
        for i, f in enumerate(self.failures):
            if f.rank >= world:
                raise ValueError(f"faults.failures.{i}.rank: rank {f.rank} is outside the {world} ranks")
            if f.action == "continue" and strategy.needs_every_rank:  # a declared Strategy
                raise ValueError(f"faults.failures.{i}.action: {strategy.name} needs every rank in each step; "
                                 "use restart")
