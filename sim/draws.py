"""The engine's random draws: the lognormal of mean 1 its jitter factors follow, and each
rank's draws of it (:class:`RankJitter`)."""
import math

import numpy as np


def lognormal_params(cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with mean 1 and coefficient of variation ``cv``:
    sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2 (so E[e^X] = e^(mu + sigma^2/2) = 1)."""
    s2 = math.log1p(cv * cv)
    return -s2 / 2, math.sqrt(s2)


class RankJitter:
    """One rank's compute noise: the lognormal factor per Compute op (or, with rho > 0,
    per step, its log an AR(1) over steps) and the straggler factor of the fault plan.
    Its generator is the rank's own (the wake-up delays draw from it too, in order)."""

    __slots__ = ("rng", "mu", "sigma", "rho", "z", "step_factor", "slow")

    def __init__(self, engine, rank):
        self.mu, self.sigma = engine.jitter
        # one generator per rank: a rank's draws do not depend on how ranks interleave
        rng = np.random.default_rng([engine.seed, rank]) if self.sigma > 0 or engine.wake > 0 else None
        engine._rngs[rank] = self.rng = rng
        self.rho = engine.rho if rng is not None else 0.0
        self.z = self.sigma * rng.standard_normal() if self.rho > 0 else 0.0  # sigma * the AR(1) state
        self.step_factor = math.exp(self.mu + self.z)
        self.slow = engine.faults.compute_factor(rank) if engine.faults is not None else 1.0

    def scale(self, dur: float) -> float:
        """``dur`` times this op's (or step's) factor and the straggler factor."""
        if self.rho > 0:
            dur *= self.step_factor
        elif self.rng is not None:
            dur *= float(self.rng.lognormal(self.mu, self.sigma))
        if self.slow != 1.0:
            dur *= self.slow
        return dur

    def next_step(self) -> None:
        """Advance the AR(1) state at a StepDone (rho > 0)."""
        if self.rho > 0:
            rho, sigma = self.rho, self.sigma
            self.z = rho * self.z + math.sqrt(1 - rho * rho) * sigma * self.rng.standard_normal()
            self.step_factor = math.exp(self.mu + self.z)
