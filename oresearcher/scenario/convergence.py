"""The scenario's optional ``convergence:`` section: predict where the loss gets.

Present (or asked for with ``--target-loss``), the simulator adds a ``convergence``
section to the report (:mod:`oresearcher.sim.convergence`): the base run's loss from a
scaling law (Chinchilla's fit unless the section gives a user's own coefficients) and the
strategy's efficiency measured on a small numeric-mode proxy. Absent, the report is as
before, byte for byte.

    convergence:
      target_loss: 2.6          # nats per token; report the time until the loss gets there
      law: {E: 1.69, A: 406.4, B: 410.7, alpha: 0.34, beta: 0.28, source: "my fit"}
      proxy_seeds: 3
      cache_dir: runs/.convergence-cache
"""
from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator

from ..models import PRESETS, n_params
from ..models.convergence import CHINCHILLA, ScalingLaw
from .types import MAX_STEPS, Float, Int, Name, Strict

# The proxy trains in numeric mode on this machine's CPU, 2 x proxy_seeds runs of
# proxy_steps steps: seconds a run at 0.13M parameters, minutes at 3.5M (gpt-small-cpu).
# A preset past this would train for hours before the report says anything.
PROXY_MAX_PARAMS = 10_000_000


class LawSpec(Strict):
    """L(N, D) = E + A / N^alpha + B / D^beta; N parameters, D tokens, loss in nats/token."""

    E: Float = Field(CHINCHILLA.E, ge=0, le=100, description="irreducible loss, nats per token")
    A: Float = Field(CHINCHILLA.A, ge=0, le=1e12, description="model-size coefficient")
    B: Float = Field(CHINCHILLA.B, gt=0, le=1e12, description="data coefficient")
    alpha: Float = Field(CHINCHILLA.alpha, gt=0, le=5, description="model-size exponent")
    beta: Float = Field(CHINCHILLA.beta, gt=0, le=5, description="data exponent")
    source: str = Field(CHINCHILLA.source, max_length=200, description="where the coefficients come from")

    def law(self) -> ScalingLaw:
        return ScalingLaw(self.E, self.A, self.B, self.alpha, self.beta, self.source)


class ConvergenceSpec(Strict):
    target_loss: Optional[Float] = Field(None, gt=0, le=100, description="loss (nats per token) whose "
                                         "predicted time the report gives; unset: only the curve and the "
                                         "final loss for training.steps")
    law: LawSpec = Field(default_factory=LawSpec, description="the base run's scaling law (default: Chinchilla)")
    proxy_model: Name = Field("gpt-proxy", description="synthetic-lm preset the efficiency proxy trains (on the CPU: "
                              "at most 10M parameters)")
    # 200: the proxy length whose multipliers benchmarks/bench_convergence.py carries to a larger model
    proxy_steps: Int = Field(200, ge=20, le=MAX_STEPS, description="steps per proxy run")
    proxy_seq_len: Int = Field(64, ge=2, le=256, description="tokens per proxy sequence")
    proxy_batch: Int = Field(1, ge=1, le=64, description="proxy sequences per agent per step")
    proxy_seeds: Int = Field(3, ge=1, le=10, description="proxy seeds; their spread is the band")
    cache_dir: str = Field("runs/.convergence-cache", min_length=1, max_length=500,
                           description="where proxy results are kept, keyed by their inputs")
    ladder: str = Field("shipped", min_length=1, max_length=500, description="where the strategy's "
                        "multiplier comes from: 'shipped' (the size ladder measured on real text that ships "
                        "with the package, benchmarks/bench_scaling.py; the proxy for settings it did not "
                        "measure), a ladder's fits file (its trend with model size, extrapolated; no row: no "
                        "prediction), or 'none' (the proxy: a small model trained now). docs/scaling.md")

    @field_validator("proxy_model")
    @classmethod
    def _small_preset(cls, name):
        if name not in PRESETS:
            raise ValueError(f"unknown synthetic-lm preset; known: {', '.join(PRESETS)}")
        if n_params(name) > PROXY_MAX_PARAMS:
            raise ValueError(f"{name} has {n_params(name):.3g} parameters; the proxy trains on the CPU, at most "
                             f"{PROXY_MAX_PARAMS:.0e} (gpt-proxy, gpt-tiny, gpt-small-cpu)")
        return name
