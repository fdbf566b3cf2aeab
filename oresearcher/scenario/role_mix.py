"""A scenario's initial role mix, rescaled to another number of agents.

``agents.roles`` counts agents per role and must add up to ``agents.count``. A flag that
changes the count (``--num_agents=16`` on a scenario written for 8) keeps the mix:
each role gets its share of the new count, rounded by the largest-remainder (Hamilton)
method, so the counts add up exactly and each lies within one of its exact share
(3/3/2 of 8 becomes 6/6/4 of 16; 1/2/1 of 4 becomes 1/1/1 of 3: the largest
remainders first, ties in the order explorer, optimizer, validator). With fsdp's sharded
agents (``fsdp.replicas: fusion``) the mix counts agents, not ranks: ranks /
``fsdp.shard_group_size`` (:func:`agents_at`).
"""
from __future__ import annotations

from typing import Optional

ORDER = ("explorer", "optimizer", "validator")


def scaled(roles: dict, count: int) -> dict:
    """``roles`` (role -> agents, positive total) rescaled to ``count`` agents."""
    total = sum(roles.get(r, 0) for r in ORDER)
    quotas = {r: count * roles.get(r, 0) / total for r in ORDER}
    out = {r: int(quotas[r]) for r in ORDER}
    left = count - sum(out.values())
    for r in sorted(ORDER, key=lambda r: (-(quotas[r] - out[r]), ORDER.index(r)))[:left]:
        out[r] += 1
    return out


def agents_at(raw: dict, ranks: int) -> int:
    """How many agents the role mix counts at ``ranks`` ranks: ranks / shard group size for
    fsdp's sharded agents (``training.strategy: fsdp``, ``fsdp.replicas: fusion``), else
    ranks. ``raw``: the scenario mapping with its overrides applied (``scenario.overridden``)."""
    from ..strategies import find_strategy

    training = raw.get("training") if isinstance(raw.get("training"), dict) else {}
    strategy = find_strategy(training.get("strategy"))  # absent or unknown: not sharded (validation names it)
    return ranks if strategy is None else strategy.agents_at(raw, ranks)


def override(raw_agents, count: int) -> Optional[str]:
    """The ``agents.roles=...`` override that keeps a scenario's mix at ``count`` agents,
    or None when there is nothing to rescale (no mix, already ``count``, or a mix that is
    not plain counts: the scenario's validation says what is wrong with it)."""
    roles = raw_agents.get("roles") if isinstance(raw_agents, dict) else None
    if not isinstance(roles, dict) or set(roles) - set(ORDER):
        return None
    values = [roles.get(r, 0) for r in ORDER]
    if not all(type(v) is int and v >= 0 for v in values) or sum(values) <= 0 or sum(values) == count:
        return None
    if not 1 <= count <= 10**6:
        return None
    new = scaled(roles, count)
    return "agents.roles={" + ", ".join(f"{r}: {new[r]}" for r in ORDER) + "}"
