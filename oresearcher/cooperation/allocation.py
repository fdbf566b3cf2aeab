"""Dynamic resource allocation: who gets how much of a round's compute.

Each fusion round has a fixed compute budget of ``total_units`` units, one unit being one
forward+backward pass of an agent's own model (a plain step costs 1 unit, a SAM step 2).
The budget is divided by

    shares = softmax(contributions / temperature), then raised to a floor,

where an agent's *contribution* is its recent reward improvement. The floor (a fraction
of the equal share) keeps every agent alive: an agent that had one bad round can still
recover, as in successive-halving schemes that never drop below a minimum budget. Units
are whole numbers that add up to ``total_units`` exactly (largest-remainder rounding),
and a step costing more units than are left carries the remainder to the next round, so
the compute spent per round stays constant (tests check both).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


def shares(contributions: Sequence[float], temperature: float = 1.0, floor: float = 0.5) -> torch.Tensor:
    """Fractions of the budget, one per agent: they sum to 1 and each is >= floor / n.

    ``floor`` is a fraction of the equal share 1/n (0: no floor, 1: equal shares).
    Non-finite contributions count as the worst.
    """
    c = torch.as_tensor(contributions, dtype=torch.float64).reshape(-1)
    n = c.numel()
    if n == 0:
        raise ValueError("shares of no agents")
    if temperature <= 0 or not 0.0 <= floor <= 1.0:
        raise ValueError(f"need temperature > 0 and floor in [0, 1], got {temperature}, {floor}")
    finite = torch.isfinite(c)
    worst = c[finite].min() if finite.any() else torch.tensor(0.0, dtype=torch.float64)
    c = torch.where(finite, c, worst)
    s = torch.softmax(c / temperature, 0)
    low = floor / n
    # Water-filling: pin every share below the floor to it and rescale the others to
    # fill what is left; repeat until no rescaled share falls below the floor (<= n passes).
    pinned = torch.zeros(n, dtype=torch.bool)
    for _ in range(n):
        free = ~pinned
        left = 1.0 - low * int(pinned.sum())
        total_free = s[free].sum()
        s = torch.where(pinned, torch.full_like(s, low),
                        s * left / total_free if total_free > 0 else torch.full_like(s, left / max(1, int(free.sum()))))
        newly = free & (s < low)
        if not newly.any():
            break
        pinned |= newly
    return s


def integer_units(fractions: torch.Tensor, total: int, minimum: int = 0) -> list[int]:
    """Whole units per agent: each >= ``minimum``, adding up to ``total`` exactly.

    Every agent first gets ``minimum``; the rest is divided in proportion to
    ``fractions`` by largest remainder (Hamilton's method), ties to the lower index.
    """
    n = len(fractions)
    if total < n * minimum:
        raise ValueError(f"{total} units cannot give {n} agents {minimum} each")
    spare = total - n * minimum
    f = torch.as_tensor(fractions, dtype=torch.float64)
    f = f / f.sum() if f.sum() > 0 else torch.full((n,), 1.0 / n, dtype=torch.float64)
    exact = f * spare
    base = torch.floor(exact).to(torch.int64)
    left = spare - int(base.sum())
    order = sorted(range(n), key=lambda i: (-float(exact[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return [minimum + int(b) for b in base]


def steps_from_units(units: Sequence[int], costs: Sequence[int], carry: Sequence[int]) -> tuple[list[int], list[int]]:
    """Local steps each agent takes and the units it carries to the next round.

    ``steps[i] * costs[i] + new_carry[i] == units[i] + carry[i]`` for every agent.
    """
    steps, left = [], []
    for u, c, k in zip(units, costs, carry):
        if c < 1:
            raise ValueError(f"a step costs at least one unit, got {c}")
        steps.append((u + k) // c)
        left.append((u + k) % c)
    return steps, left


@dataclass
class AllocationState:
    """Rewards of the previous round and each agent's carried units."""

    n: int
    temperature: float = 1.0
    floor: float = 0.5
    enabled: bool = True
    last_reward: list = field(default_factory=list)
    carry: list = field(default_factory=list)

    def __post_init__(self):
        self.last_reward = list(self.last_reward) or [float("nan")] * self.n
        self.carry = list(self.carry) or [0] * self.n

    def plan(self, rewards: Sequence[float], units_per_round: int, costs: Sequence[int]) -> tuple[list[int], torch.Tensor]:
        """Next round's local steps per agent from this round's rewards; returns (steps, shares)."""
        contrib = [r - p if p == p else 0.0 for r, p in zip(rewards, self.last_reward)]  # p == p: not NaN
        self.last_reward = [float(r) for r in rewards]
        if self.enabled:
            s = shares(contrib, self.temperature, self.floor)
        else:
            s = torch.full((self.n,), 1.0 / self.n, dtype=torch.float64)
        # the minimum is one step of the dearest role, so every agent steps every round
        units = integer_units(s, units_per_round, minimum=min(max(costs), units_per_round // self.n))
        steps, self.carry = steps_from_units(units, costs, self.carry)
        return steps, s

    def state_dict(self) -> dict:
        return {"n": self.n, "temperature": self.temperature, "floor": self.floor, "enabled": self.enabled,
                "last_reward": list(self.last_reward), "carry": list(self.carry)}

    def load_state_dict(self, state: dict) -> None:
        for k in ("n", "temperature", "floor", "enabled", "last_reward", "carry"):
            setattr(self, k, state[k])
